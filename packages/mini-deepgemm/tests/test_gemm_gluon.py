"""The Gluon contiguous FP8 x FP4 GEMM (gemm_gluon_kernel, docs/reports/deepgemm-gluon.md).

It replaces the swap-AB kernel for FP4 weights at more than 96 rows per group and computes the same products in the
same order, so its output must equal that kernel's bit for bit, padding rows included (left untouched), and the
public API must route there. Against the pure-torch reference on the same operands: DeepGEMM's diff below 1e-5.
Shapes: V4.1's w13 and w2 with ragged groups (empty groups, a one-row group, 1,024 rows) and a K of two steps,
fewer than the copy ring's stages. GPU and triton 3.6 only (Gluon's experimental API is pinned to the release it was
measured with).
"""

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm._backend import gluon_usable
from mini_deepgemm.testing import calc_diff, contiguous_layout, random_bf16, random_fp4_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not gluon_usable(), reason="needs CUDA and triton 3.6"),
]

CASES = {  # rows per group, N, K
    "w13-ragged": ([300, 0, 1, 128, 1024, 77, 513, 0, 129], 4608, 5120),
    "w2": ([200, 640, 1, 250], 5120, 2304),
    "k128": ([150, 260], 256, 128),
}


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_gluon_equals_the_swapab_kernel_and_the_reference(case, stages):
    rows, N, K = CASES[case]
    gen = torch.Generator().manual_seed(3)
    layout = contiguous_layout(rows, gemm.get_m_alignment_for_contiguous_layout())
    M, G = layout.numel(), len(rows)
    q, s = reference.act_quant(random_bf16(M, K, generator=gen), 32, "ue8m0")
    _, bq, sb = random_fp4_weights(G, N=N, K=K, device="cuda", generator=gen)
    q, s, layout = q.cuda(), s.cuda(), layout.cuda()
    cfg = gemm.default_config(gemm._CONTIGUOUS, M, 32, True, N, G, True)
    assert cfg.get("GLUON"), "more than 96 rows per group must select the Gluon kernel"
    cfg = {**cfg, "GLUON_STAGES": stages}
    x = gemm._dequant_activations(q, s.view(torch.uint8), True, grouped_layout=layout)
    w, ws = bq.view(torch.uint8), sb.view(torch.uint8)

    got = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm._gluon_contiguous_fp4_gemm(x, w, ws, got, layout, cfg)
    want = torch.full_like(got, 7.0)
    gemm._swapab_gemm(x, None, w, ws, want, gemm._CONTIGUOUS, layout, True, cfg)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))

    real = layout >= 0
    api = torch.full_like(got, 7.0)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), api, layout)
    assert torch.equal(api.view(torch.int16), got.view(torch.int16)), "the public API must route to the Gluon kernel"
    assert bool((got[~real] == 7.0).all()), "padding rows of d must be left untouched"

    ref = torch.zeros_like(got)
    gemm._reference(gemm._CONTIGUOUS, (q, s), (bq, sb), ref, None, layout, gemm.FP4_RECIPE)
    assert calc_diff(got[real], ref[real]) < 1e-5
