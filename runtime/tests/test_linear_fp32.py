"""layers/linear_fp32.py: the head / MoE-gate kernel against an fp64 oracle and the fp32 reference, its batch
invariance (a row's bits do not depend on the other rows), and the CPU fallback.

Metric: relative L2 error against the fp64 product of the same bf16 values. The products are exact in fp32, so only
the fp32 summation order differs from the reference; both must be within 1e-6 of the oracle."""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers.linear_fp32 import linear_fp32, linear_fp32_ref


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
