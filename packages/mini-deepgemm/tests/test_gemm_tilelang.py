"""The TileLang kernels (gemm_tilelang.py) against the pure-torch references, on the GPU only.

Same metric and bounds as test_gemm.py: calc_diff < 1e-5 against the reference fed the same quantized
operands, DeepGEMM's bounds against the unquantized product, repeated runs bitwise identical. Every call is
forced onto TileLang (`backend="tilelang"`), whatever gemm.TILELANG_FAMILIES routes by default.
"""

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm._backend import tilelang_importable
from mini_deepgemm.testing import calc_diff, contiguous_layout, random_bf16, random_fp4_weights, random_fp8_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not tilelang_importable(), reason="needs tilelang"),
]
SAME_INPUTS_TOL = 1e-5
DENSE_SHAPES = [  # V4.1 (N, K) at decode, ragged and prefill M
    (1, 1280, 5120), (77, 32768, 1280), (300, 512, 5120), (513, 5120, 8192), (4096, 4096, 1280),
    (4096, 4608, 5120), (129, 5120, 2304), (1000, 25600, 6144),
]


def weights(kind, *lead, N, K, gen):
    """(w bf16, q, s, gran_n, gran_k, unquantized tolerance) on CUDA for kind 'v41' | 'v3' | 'fp4'."""
    if kind == "fp4":
        return (*random_fp4_weights(*lead, N=N, K=K, device="cuda", generator=gen), 1, 32, 1e-2)
    block, fmt = (32, "ue8m0") if kind == "v41" else (128, "fp32")
    return (*random_fp8_weights(*lead, N=N, K=K, block=block, scale_fmt=fmt, device="cuda", generator=gen),
            block, block, 1e-3)


def quant_a(x, gran_k):
    return reference.act_quant(x, gran_k, "ue8m0" if gran_k == 32 else "fp32")


def run(layout, a, b, d, group_arg, b_fp4):
    gemm._gemm(layout, a, b, d, None, group_arg, None, allow_fp4=b_fp4, backend="tilelang")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("kind", ["v3", "v41", "fp4"])
def test_dense(gen, kind):
    for M, N, K in DENSE_SHAPES:
        w, bq, bs, gran_n, gran_k, tol = weights(kind, N=N, K=K, gen=gen)
        x = random_bf16(M, K, generator=gen).cuda()
        aq, as_ = quant_a(x, gran_k)
        d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        run(gemm._DENSE, (aq, as_), (bq, bs), d, None, kind == "fp4")
        ref = reference.gemm_nt_ref(aq, as_, bq, bs, gran_n, gran_k)
        assert calc_diff(d, ref) < SAME_INPUTS_TOL, (kind, M, N, K, calc_diff(d, ref))
        assert calc_diff(d, x.float() @ w.float().T) < tol, (kind, M, N, K)
        d2 = torch.empty_like(d)
        run(gemm._DENSE, (aq, as_), (bq, bs), d2, None, kind == "fp4")
        assert torch.equal(d.view(torch.int16), d2.view(torch.int16)), "repeated runs must be bitwise identical"


@pytest.mark.parametrize("kind", ["fp4", "v41"])
def test_contiguous_grouped(gen, kind):
    """Ragged experts, two empty groups and a group of one row; padding rows (-1) stay untouched."""
    rows, N, K = [300, 0, 1, 128, 1024, 77, 513, 0, 129], 4608, 5120
    layout = contiguous_layout(rows, gemm.get_m_alignment_for_contiguous_layout()).cuda()
    M = layout.numel()
    w, bq, bs, gran_n, gran_k, tol = weights(kind, len(rows), N=N, K=K, gen=gen)
    x = random_bf16(M, K, generator=gen).cuda()
    aq, as_ = quant_a(x, gran_k)
    d = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    run(gemm._CONTIGUOUS, (aq, as_), (bq, bs), d, layout, kind == "fp4")
    ref = reference.m_grouped_gemm_nt_contiguous_ref(aq, as_, bq, bs, layout, gran_n, gran_k)
    valid = layout >= 0
    assert calc_diff(d[valid], ref[valid]) < SAME_INPUTS_TOL, calc_diff(d[valid], ref[valid])
    assert bool((d[~valid] == 7.0).all()), "padding rows must be left untouched"
    for g, m in enumerate(rows):  # each expert against its own unquantized product
        sel = (layout == g).nonzero().squeeze(1)
        if m:
            assert calc_diff(d[sel], x[sel].float() @ w[g].float().T) < tol, g
    d2 = torch.full_like(d, 7.0)
    run(gemm._CONTIGUOUS, (aq, as_), (bq, bs), d2, layout, kind == "fp4")
    assert torch.equal(d.view(torch.int16), d2.view(torch.int16))


def test_dispatch_outside_coverage_raises(gen):
    """fp32 accumulate-into is the Triton kernel's: forcing TileLang on it is an error, not a silent fallback."""
    _, bq, bs, *_ = weights("v41", N=256, K=512, gen=gen)
    aq, as_ = quant_a(random_bf16(64, 512, generator=gen).cuda(), 32)
    d = torch.zeros(64, 256, device="cuda")
    with pytest.raises(ValueError, match="TileLang"):
        gemm._gemm(gemm._DENSE, (aq, as_), (bq, bs), d, d, None, None, allow_fp4=False, backend="tilelang")
