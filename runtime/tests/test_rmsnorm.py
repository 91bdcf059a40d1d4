"""The fused RMSNorm kernel (layers/rmsnorm.py) against ops.rmsnorm, and ops.norm's choice between them.

Kernel cases run on CUDA (marked gpu), or on CPU under the Triton interpreter when TRITON_INTERPRET=1 is set.
Metric: every output within one rounding of the output dtype of the reference, |fused - ref| <= 2^-p |ref| + tiny
(p = 7 for bf16, 10 for fp16, 20 for fp32: the sums of squares differ in order, a few ulp in rstd), and for
bf16 on CUDA at least 95% of the elements equal. Inputs are random rows of differing scales (1e-3 .. 1e2) and
random weights, never zeros. A row's output is bit-identical whatever batch it is in (the sum runs within a row).
"""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers import rmsnorm as rmsf
from mini_deepinfer.models.deepseek_v41 import ops

from kernel_devices import INTERPRET, assert_within_one_rounding

EPS = 1e-20  # V41Config.rms_norm_eps
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# (rows, D, dtype): the V4.1 norms (block 5,120, q 1,280, kv / compressor 512, index keys 128) at prefill and
# decode row counts, ragged D, fp16 / fp32 inputs
SHAPES = [(1, 5120, BF16), (4096, 5120, BF16), (17, 1280, BF16), (300, 512, BF16), (33, 128, BF16),
          (5, 1001, BF16), (7, 5120, FP32), (9, 768, FP16)]
if torch.cuda.is_available():
    CASES = [pytest.param("cuda", *s, marks=pytest.mark.gpu) for s in SHAPES]
    DEVICE = pytest.param("cuda", marks=pytest.mark.gpu)
elif INTERPRET:
    CASES = [("cpu", 3, 128, BF16), ("cpu", 2, 200, FP32)]
    DEVICE = "cpu"
else:
    CASES = [pytest.param("cuda", 1, 128, BF16, marks=[pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")])]
    DEVICE = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")])
needs_triton = pytest.mark.skipif(rmsf.triton is None, reason="needs triton")


def _inputs(rows: int, D: int, dtype: torch.dtype, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scales = 10 ** (torch.rand(rows, 1, generator=g) * 5 - 3)
    x = (torch.randn(rows, D, generator=g) * scales).to(dtype)
    w = (torch.rand(D, generator=g) * 1.5 + 0.25).to(BF16)
    return x.to(device), w.to(device)


@needs_triton
@pytest.mark.parametrize("device,rows,D,dtype", CASES)
def test_fused_rmsnorm_matches_the_reference(device: str, rows: int, D: int, dtype: torch.dtype) -> None:
    x, w = _inputs(rows, D, dtype, device, seed=rows + D)
    assert_within_one_rounding(rmsf.rmsnorm_fused(x, w, EPS), ops.rmsnorm(x, w, EPS), atol=1e-30)


@needs_triton
@pytest.mark.parametrize("device", [DEVICE])
def test_fused_rmsnorm_layouts_and_batch_invariance(device: str) -> None:
    D = 512 if device == "cpu" else 5120
    x, w = _inputs(12, 2 * D, BF16, device, seed=5)
    rows = x[:, :D]  # row stride 2 D: a view, not a copy
    got = rmsf.rmsnorm_fused(rows, w[:D], EPS)
    assert_within_one_rounding(got, ops.rmsnorm(rows, w[:D], EPS), atol=1e-30)
    stacked = rmsf.rmsnorm_fused(rows.reshape(3, 4, D), w[:D], EPS)  # leading dims flattened and restored
    assert stacked.shape == (3, 4, D) and torch.equal(stacked.reshape(12, D), got)
    for i in (0, 7, 11):  # a row alone: bit-identical to the same row in the batch
        assert torch.equal(rmsf.rmsnorm_fused(rows[i:i + 1].clone(), w[:D], EPS), got[i:i + 1])
    assert rmsf.rmsnorm_fused(rows[:0], w[:D], EPS).shape == (0, D)


def test_fused_rmsnorm_rejects_a_weight_of_the_wrong_length() -> None:
    x, w = _inputs(2, 64, BF16, "cpu", seed=1)
    with pytest.raises(ValueError, match="weight of shape \\(63,\\) for rows of 64"):
        rmsf.rmsnorm_fused(x, w[:63], EPS)


def test_norm_takes_the_kernel_only_for_kernel_weights_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """ops.norm: the reference's plain dict and any CPU tensor take ops.rmsnorm (the oracle stays kernel-free);
    KernelWeights on CUDA take the fused kernel."""
    x, w = _inputs(3, 256, BF16, "cpu", seed=2)
    calls = []
    monkeypatch.setattr(rmsf, "rmsnorm_fused", lambda *a: calls.append(a) or ops.rmsnorm(*a))
    assert torch.equal(ops.norm(x, {"n.weight": w}, "n.weight", EPS), ops.rmsnorm(x, w, EPS))
    assert torch.equal(ops.norm(x, ops.KernelWeights({"n.weight": w}), "n.weight", EPS), ops.rmsnorm(x, w, EPS))
    assert not calls
    if torch.cuda.is_available() and rmsf.triton is not None:
        xc, wc = x.cuda(), w.cuda()
        ops.norm(xc, {"n.weight": wc}, "n.weight", EPS)
        assert not calls
        ops.norm(xc, ops.KernelWeights({"n.weight": wc}), "n.weight", EPS)
        assert len(calls) == 1
