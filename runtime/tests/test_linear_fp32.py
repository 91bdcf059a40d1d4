"""layers/linear_fp32.py: the head / MoE-gate kernel against an fp64 oracle and the fp32 reference, its batch
invariance (a row's bits do not depend on the other rows), and the CPU fallback; the same for the split-K form
(linear_fp32_planes), whose two ways (planes summed in order, whole rows) must also give the same bits.

Metric: relative L2 error against the fp64 product of the same bf16 values. The products are exact in fp32, so only
the fp32 summation order differs from the reference; both must be within 1e-6 of the oracle.

The unsliced kernel runs on CUDA only (marked gpu). The split-K tests run on CUDA (marked gpu) and on CPU under the
Triton interpreter when TRITON_INTERPRET=1 is set (smaller K; there the kernel multiplies in fp32, since the
interpreter's dot misreads bf16 operands, and adds with numpy); CPU CI runs them that way through the last test."""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers import linear_fp32 as lf
from mini_deepinfer.layers.linear_fp32 import linear_fp32, linear_fp32_ref

from kernel_devices import DEVICE, interpreter_child, kernel_test, run_under_interpreter, sum_in_order


def split_k_test(fn):
    """A split-K test: kernel_devices.kernel_test, and skipped without triton."""
    return pytest.mark.skipif(lf.triton is None, reason="needs triton")(kernel_test(fn))


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def operands(T: int, N: int, D: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(T * 7919 + N * 31 + D)
    x = torch.randn(T, D, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(N, D, generator=g, device=device) * D**-0.5).to(torch.bfloat16)
    return x, w


def test_cpu_falls_back_to_the_reference_and_rejects_mismatched_shapes():
    x, w = operands(5, 40, 96, "cpu")
    assert torch.equal(linear_fp32(x, w), linear_fp32_ref(x, w))
    with pytest.raises(ValueError, match="do not share D"):
        linear_fp32(x, w[:, :64])
    for bad in (0, 100, -64):
        with pytest.raises(ValueError, match="k_slice"):
            lf.linear_fp32_planes(x, w, bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "T,N,D",
    [(1, 129280, 5120), (32, 129280, 5120), (7, 1000, 128), (33, 384, 5120), (200, 37, 96), (65, 130, 4160)],
    ids=["head-1", "head-32", "small", "gate-33", "ragged-d96", "ragged-n130"],
)
def test_kernel_matches_the_fp64_oracle_like_the_reference(T, N, D):
    x, w = operands(T, N, D, "cuda")
    oracle = x.double() @ w.double().T
    got = linear_fp32(x, w)
    assert got.dtype == torch.float32 and got.shape == (T, N)
    err, ref_err = rel_l2(got, oracle), rel_l2(linear_fp32_ref(x, w), oracle)
    assert err < 1e-6, (err, ref_err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_rows_bits_do_not_depend_on_the_batch():
    x, w = operands(200, 1000, 5120, "cuda")
    full = linear_fp32(x, w)
    assert torch.equal(linear_fp32(x[17:18], w), full[17:18])
    assert torch.equal(linear_fp32(x[40:73], w), full[40:73])
    assert torch.equal(linear_fp32(x[x.shape[0] - 1 :].clone(), w), full[-1:])
    assert torch.equal(linear_fp32(x, w), full)  # repeated calls


# split-K cases (T, N, D, k_slice): the gate's shape (10 slices of 512 on CUDA, 3 under the interpreter), a ragged K
# (1,000: neither a multiple of the slice nor of BLOCK_K), ragged N and T, one-step slices, no tokens
SPLIT_CASES = [(64, 384, 1536, 512), (7, 100, 1000, 128), (33, 70, 320, 64), (0, 384, 512, 128)]
if DEVICE == "cuda":
    SPLIT_CASES += [(1, 384, 5120, 512), (64, 384, 5120, 512), (4096, 384, 5120, 512), (65, 130, 4160, 512),
                    (200, 37, 96, 64), (3, 129280, 5120, 1024)]


@split_k_test
@pytest.mark.parametrize("T,N,D,k_slice", SPLIT_CASES)
def test_split_k_matches_the_fp64_oracle_like_the_reference(T, N, D, k_slice):
    x, w = operands(T, N, D, DEVICE)
    planes = lf.linear_fp32_planes(x, w, k_slice, split=True)
    whole = lf.linear_fp32_planes(x, w, k_slice, split=False)
    assert planes.shape == (-(-D // k_slice), T, N) and whole.shape == (1, T, N) and planes.dtype == torch.float32
    got = sum_in_order(planes)
    assert torch.equal(got, whole[0])  # planes summed in order = whole rows, bit for bit
    if DEVICE == "cuda":  # whichever way split_grid picks for this T
        assert torch.equal(sum_in_order(lf.linear_fp32_planes(x, w, k_slice)), got)
    if T:
        oracle = x.double() @ w.double().T
        err, ref_err = rel_l2(got, oracle), rel_l2(linear_fp32_ref(x, w), oracle)
        print(f"split-K rel L2 vs fp64: {err:.2e} (fp32 reference: {ref_err:.2e})")
        assert err < 1e-6, (err, ref_err)


@split_k_test
def test_split_k_rows_do_not_depend_on_the_batch():
    """Rows of a 64-token call equal, bit for bit, the same rows computed alone, in 33-token calls, and either way
    (planes or whole rows); on CUDA also inside a 4,096-token call (which split_grid runs as whole rows). Under the
    interpreter tl.dot is numpy's matmul, whose bits for a row can depend on the row's place in the 32-row tile (on an
    AVX2-only EPYC, session 76: rows 17 and 31 moved to the tile's top differ), so there the rows keep their places."""
    D = 5120 if DEVICE == "cuda" else 1536
    x, w = operands(64, 384, D, DEVICE)
    full = sum_in_order(lf.linear_fp32_planes(x, w, 512, split=True))
    row_sets = (slice(17, 18), slice(31, 64)) if DEVICE == "cuda" else (slice(0, 1), slice(32, 64))
    for rows in (*row_sets, slice(0, 33)):
        for split in (True, False):
            assert torch.equal(sum_in_order(lf.linear_fp32_planes(x[rows].clone(), w, 512, split=split)), full[rows])
    if DEVICE == "cuda":
        big = torch.cat([operands(4096 - 64, 384, D, DEVICE)[0], x])
        assert not lf.split_grid(big.shape[0], 384, big.device) and lf.split_grid(64, 384, big.device)
        assert torch.equal(sum_in_order(lf.linear_fp32_planes(big, w, 512))[-64:], full)
        assert torch.equal(sum_in_order(lf.linear_fp32_planes(x[5:6], w, 512)), full[5:6])


@interpreter_child
@pytest.mark.skipif(lf.triton is None, reason="needs triton")
def test_split_k_runs_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's split-K kernel tests once under TRITON_INTERPRET=1."""
    run_under_interpreter(__file__, "-k", "split_k and not interpreter")
