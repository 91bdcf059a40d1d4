"""The Gluon grouped FP8 x FP4 GEMM (gemm_gluon_kernel, docs/reports/deepgemm-gluon.md), contiguous and masked.

It replaces the swap-AB kernel for FP4 weights (contiguous: more than 48 rows per group, on the warp-specialized
kernel; masked: always) and computes the same products in the same order, so its output must equal that kernel's
bit for bit (contiguous: both Gluon kernels), with the padding / unused rows left untouched, and the public API must
route there. Against the pure-torch reference on the same operands: DeepGEMM's diff below 1e-5. Shapes: V4.1's w13
and w2 with ragged groups (empty groups, a one-row group, 1,024 rows; masked: 0, 1, 17 and all 48 rows of a group;
w13 has more tiles than SMs, so persistent programs take several; 33-96 rows per group, the 1-GPU prefill's, where
half of a 128-token tile is padding), an N that leaves a partial 256-row weight tile
(its rows come from the next group or past the last one) and a K of two steps, fewer than the copy ring's stages.
GPU and triton 3.6 only (Gluon's experimental API is pinned to the release it was measured with).
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
    "n384": ([300, 1, 0, 520], 384, 256),
    "few-rows": ([60, 90, 49, 80, 70, 64, 33, 96], 512, 512),
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
    # the rows hint of the runtime's fixed-size layouts (moe.max_rows: real rows + G x 127), so the rule sees the
    # real rows per group
    cfg = gemm.default_config(gemm._CONTIGUOUS, sum(rows) + G * 127, 32, True, N, G, True)
    assert cfg.get("GLUON"), "more than 48 rows per group must select the Gluon kernel"
    assert cfg.get("GLUON_WS"), "the contiguous layout runs the warp-specialized kernel"
    cfg = {**cfg, "GLUON_STAGES": stages}
    x = gemm._dequant_activations(q, s.view(torch.uint8), True, grouped_layout=layout)
    w, ws = bq.view(torch.uint8), sb.view(torch.uint8)

    got = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm._gluon_fp4_grouped_gemm(gemm._CONTIGUOUS, x, w, ws, got, layout, cfg)
    want = torch.full_like(got, 7.0)
    gemm._swapab_gemm(x, None, w, ws, want, gemm._CONTIGUOUS, layout, True, cfg)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "warp-specialized kernel vs swap-AB kernel"
    one_warpgroup = torch.full_like(got, 7.0)
    gemm._gluon_fp4_grouped_gemm(gemm._CONTIGUOUS, x, w, ws, one_warpgroup, layout, {**cfg, "GLUON_WS": False})
    assert torch.equal(one_warpgroup.view(torch.int16), want.view(torch.int16)), "fp4_grouped_gemm_kernel vs swap-AB"

    real = layout >= 0
    api = torch.full_like(got, 7.0)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), api, layout)
    assert torch.equal(api.view(torch.int16), got.view(torch.int16)), "the public API must give the same bits"
    assert bool((got[~real] == 7.0).all()), "padding rows of d must be left untouched"

    ref = torch.zeros_like(got)
    gemm._reference(gemm._CONTIGUOUS, (q, s), (bq, sb), ref, None, layout, gemm.FP4_RECIPE)
    assert calc_diff(got[real], ref[real]) < 1e-5


MASKED_CASES = {  # masked_m, max_m, N, K, expected_m
    "w13-m8": ([0, 1, 17, 48, 5], 48, 4608, 5120, 8),
    "w2-m32": ([0, 1, 17, 48, 33], 48, 5120, 2304, 32),
    "k128": ([3, 40], 48, 256, 128, 8),
}


@pytest.mark.parametrize("case", list(MASKED_CASES))
def test_masked_gluon_equals_the_swapab_kernel_and_the_reference(case):
    counts, max_m, N, K, expected_m = MASKED_CASES[case]
    gen = torch.Generator().manual_seed(4)
    G = len(counts)
    q, s = reference.act_quant(random_bf16(G, max_m, K, generator=gen), 32, "ue8m0")
    _, bq, sb = random_fp4_weights(G, N=N, K=K, device="cuda", generator=gen)
    q, s = q.cuda(), s.cuda()
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    cfg = gemm.default_config(gemm._MASKED, expected_m, 32, True, N, G, True)
    assert cfg.get("GLUON") and cfg["X_FP8"]
    a, w, ws = (q, s.view(torch.uint8)), bq.view(torch.uint8), sb.view(torch.uint8)

    got = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm._launch_swapab(gemm._MASKED, a, (w, ws), got, masked_m, True, cfg)
    want = torch.full_like(got, 7.0)
    gemm._swapab_gemm(q, s.view(torch.uint8), w, ws, want, gemm._MASKED, masked_m, True, cfg)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "activations dequantized in the tile or by the pass"

    api = torch.full_like(got, 7.0)
    gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq, sb), api, masked_m, expected_m)
    assert torch.equal(api.view(torch.int16), got.view(torch.int16)), "the public API must route to the Gluon kernel"
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    assert bool((got[~used] == 7.0).all()), "rows past masked_m must be left untouched"

    ref = torch.zeros_like(got)
    gemm._reference(gemm._MASKED, (q, s), (bq, sb), ref, None, masked_m, gemm.FP4_RECIPE)
    assert calc_diff(got[used], ref[used]) < 1e-5


def one_hot_conversion(layout: str, bq: torch.Tensor, sb: torch.Tensor, fold: bool) -> torch.Tensor:
    """bf16 [K, N]: the Gluon FP4 kernel (masked, or the warp-specialized contiguous one) on one-hot activation rows
    (row m is 1 at K position m, in the FP4 K order), so d[m, n] = dequant(w)[n, m] from a single nonzero product:
    the kernel's in-register e2m1 -> bf16 conversion, isolated. bq uint8 [1, N, K/2], sb uint8 [1, N, K/32]."""
    N, K = bq.shape[1], 2 * bq.shape[2]
    eye = torch.eye(K, dtype=torch.bfloat16).view(K, K // 64, 32, 2)
    x = torch.cat([eye[..., 0], eye[..., 1]], dim=-1).view(K, K).cuda()  # FP4 K order: [32 even | 32 odd] per 64
    w, ws = bq.cuda(), sb.cuda()
    if layout == "masked":
        cfg = {**gemm.default_config(gemm._MASKED, 8, 32, True, N, 1, True), "GLUON_FOLD": fold}
        got = torch.full((1, K, N), 7.0, dtype=torch.bfloat16, device="cuda")
        rows = torch.tensor([K], device="cuda", dtype=torch.int32)
        gemm._gluon_fp4_grouped_gemm(gemm._MASKED, x[None], w, ws, got, rows, cfg)
        return got[0].cpu()
    cfg = {**gemm.default_config(gemm._CONTIGUOUS, K + 127, 32, True, N, 1, True), "GLUON_FOLD": fold}
    assert cfg.get("GLUON_WS")
    got = torch.full((K, N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm._gluon_fp4_grouped_gemm(gemm._CONTIGUOUS, x, w, ws, got, torch.zeros(K, device="cuda", dtype=torch.int32), cfg)
    return got.cpu()


@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "folded"])
@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_weight_conversion_is_exact_at_every_code_and_scale_byte(layout, fold):
    """The kernels' conversion (gemm_gluon_kernel.weights_of_step) against the reference dequantization, exactly:
    every byte value (both nibbles, -0 included) with scale bytes from 7 (the smallest whose values stay fp32-normal
    in the tensor core) to 252 (the largest whose 6 x 2^(e - 127) is a finite bf16); folded, up to its bound, 128.
    Then the folded conversion against the unfolded one, bitwise, at every scale byte it takes, 0-128: byte 0 is
    scale 0 in both (the reference's is 2^-127, docs/reports/deepgemm-gluon.md), and the smallest bytes give bf16
    subnormals."""
    N = K = 256
    gen = torch.Generator().manual_seed(6)
    bq = torch.randperm(N * K // 2, generator=gen).remainder(256).to(torch.uint8).view(1, N, K // 2)
    sb = torch.randint(7, 129 if fold else 253, (1, N, K // 32), generator=gen, dtype=torch.uint8)
    want = reference.fp4_dequant(bq[0], sb[0].view(torch.float8_e8m0fnu)).t().to(torch.bfloat16)
    assert torch.equal(one_hot_conversion(layout, bq, sb, fold).float(), want.float())
    if fold:
        every = torch.arange(N * K // 32).remainder(129).to(torch.uint8).view(1, N, K // 32)
        folded = one_hot_conversion(layout, bq, every, True)
        assert torch.equal(folded.view(torch.int16), one_hot_conversion(layout, bq, every, False).view(torch.int16))


def test_public_api_folds_only_under_a_stated_bound(monkeypatch):
    """weight_scale_max <= 128 routes the folded conversion (the same bits on real-looking scales); the default
    (no bound stated) and a bound above 128 keep the unfolded one, which is exact for every byte."""
    launched = []
    kernel = gemm._gluon_fp4_grouped_gemm
    monkeypatch.setattr(gemm, "_gluon_fp4_grouped_gemm",
                        lambda *args: launched.append(bool(args[-1].get("GLUON_FOLD"))) or kernel(*args))
    counts, max_m, N, K = [3, 17, 0, 9], 32, 512, 256
    gen = torch.Generator().manual_seed(8)
    G = len(counts)
    q, s = reference.act_quant(random_bf16(G, max_m, K, generator=gen), 32, "ue8m0")
    _, bq, sb = random_fp4_weights(G, N=N, K=K, device="cuda", generator=gen)
    # random_bf16's spread reaches bytes above 128 (131 at this seed); a checkpoint's amax / 6 scales stay near 120
    sb = sb.view(torch.uint8).clamp(max=128).view(sb.dtype)
    a, masked_m = (q.cuda(), s.cuda()), torch.tensor(counts, dtype=torch.int32, device="cuda")
    bound = int(sb.view(torch.uint8).max())
    outs = []
    for weight_scale_max in (255, 129, bound):
        d = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, (bq, sb), d, masked_m, 8, weight_scale_max=weight_scale_max)
        outs.append(d)
    assert launched == [False, False, True]
    assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16))
