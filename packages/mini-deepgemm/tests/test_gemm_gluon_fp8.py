"""The Gluon dense FP8 GEMM of the DeepSeek-V3 recipe (gemm_gluon_fp8_kernel: TMA ring, FP8 wgmma promoted per 128
of K, docs/reports/deepgemm-gluon-v3.md).

`fp8_gemm_nt` with fp32 scales routes there at more than 64 rows and at least one 128 x 128 tile per SM (a spy on
the launcher proves it, and that smaller or fp32-output calls stay on gemm_kernel); against the
pure-torch reference on the same quantized operands: DeepGEMM's diff below 1e-5 (the products are exact; only the
order of the fp32 sums and the bf16 output rounding differ); against gemm_kernel's Triton version of the same math:
below 1e-6; a second call is bitwise equal. Shapes: ragged M (65: one partial row tile), N not a multiple of the
128-column tile (520, 2,056: a partial B tile and a partial last scale block), K of one step (fewer than the ring's
stages) and V4.1 projection shapes; 128 x 128, 128 x 256 (N = 520 and 2,056: a 256-column tile with its second
half partly or wholly past N) and 64 x 128 tiles, one program per tile and persistent programs that run several
tiles, all bitwise equal to each other (the same MMA and promotion per element). GPU and triton 3.6 only.

The kernel is warp-specialized (a TMA producer warp and one partition per math warpgroup handing ring slots over by
mbarriers),
so a mistake there hangs rather than fails: before the first test, one small call per variant runs in a child
process with a time limit, and every test of the module errors if it did not finish.
"""

import pytest
import torch

from mini_deepgemm import gemm
from mini_deepgemm._backend import gluon_usable
from mini_deepgemm.testing import block_scaled_operands, calc_diff, run_finishes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not gluon_usable(), reason="needs CUDA and triton 3.6"),
]

SHAPES = [(65, 256, 128), (300, 1280, 5120), (1000, 520, 1280), (257, 4608, 2304), (1100, 2056, 256),
          (2048, 5120, 8192)]
# (rows, columns per tile, persistent programs per SM; 0 = one program per tile, store buffers per math warpgroup,
# K steps in pairs): the last two shapes have more tiles than programs, so a persistent program runs several, with
# the next tile's loads issued under the current one's MMAs (and with two buffers, a 256-column tile's halves stored
# back to back). In pairs where the K steps are even (K = 128 takes the one-step loop)
VARIANTS = [(128, 128, 0, 1, 0), (128, 128, 1, 1, 0), (128, 256, 1, 1, 0), (128, 256, 0, 1, 0), (64, 128, 2, 1, 0),
            (128, 256, 1, 2, 0), (128, 128, 1, 1, 1), (128, 128, 0, 1, 1)]
SMOKE_S = 180  # a cold compile of each variant plus torch's start: well under a minute


def variant_config(M: int, block_m: int, block_n: int, per_sm: int, store_bufs: int, pairs: int) -> dict:
    cfg = gemm.gemm_kernel_config(gemm._DENSE, M, 128, False)
    assert cfg.get("GLUON"), "dense V3 GEMMs above 64 rows must select the Gluon kernel (where _use_gluon_v3 allows)"
    # (with a second store buffer, _gluon_v3_store_bufs caps the ring at 3 stages)
    return {**cfg, "GLUON_BLOCK_M": block_m, "GLUON_BLOCK_N": block_n, "GLUON_STAGES": 3 if block_m == 64 else 4,
            "GLUON_PROGRAMS_PER_SM": per_sm, "GLUON_STORE_BUFS": store_bufs, "GLUON_PAIRS": bool(pairs)}


@pytest.fixture(scope="module", autouse=True)
def kernel_finishes():
    """One 256 x 256 x 512 call per variant (tiles of four K steps: a lap of the ring) in a child
    process that must finish within SMOKE_S."""
    code = f"""
import torch
from mini_deepgemm import gemm
aq = torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn)
bq = torch.randn(256, 512, device="cuda").to(torch.float8_e4m3fn)
sa, sb = torch.rand(256, 4, device="cuda"), torch.rand(2, 4, device="cuda")
d = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
for cfg in {[variant_config(256, *variant) for variant in VARIANTS]!r}:
    gemm._gluon_fp8_v3_gemm(aq, sa, bq, sb, d, cfg)
    torch.cuda.synchronize()
"""
    run_finishes(code, SMOKE_S, "the Gluon V3 kernel on a 256 x 256 x 512 call")


def v3_operands(M: int, N: int, K: int, gen: torch.Generator):
    """V3-recipe operands on the GPU: fp32 scales per 1 x 128 and 128 x 128 (testing.block_scaled_operands)."""
    aq, sa, bq, sb = (t.cuda() for t in block_scaled_operands(M, N, K, 128, "fp32", gen))
    return (aq, sa), (bq, sb)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "%dx%d_p%d_b%d_pairs%d" % v)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gluon_v3_matches_reference_and_triton(M, N, K, variant):
    gen = torch.Generator().manual_seed(M + N + K)
    a, b = v3_operands(M, N, K, gen)
    cfg = variant_config(M, *variant)
    got = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    gemm._gluon_fp8_v3_gemm(*a, *b, got, cfg)
    again = torch.empty_like(got)
    gemm._gluon_fp8_v3_gemm(*a, *b, again, cfg)
    assert torch.equal(got.view(torch.int16), again.view(torch.int16)), "repeated calls must be bitwise identical"

    triton_out = torch.empty_like(got)
    gemm._gemm(gemm._DENSE, a, b, triton_out, None, None, None, False, config={**cfg, "GLUON": False})
    assert calc_diff(got, triton_out) < 1e-6

    ref = torch.empty_like(got)
    gemm._reference(gemm._DENSE, a, b, ref, None, None, gemm.V3_RECIPE)
    assert calc_diff(got, ref) < 1e-5


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_tile_shapes_give_the_same_bits(M, N, K):
    """Every variant computes each element with the same MMA over the same K slices and the same promotion, so the
    tile shape (and with it _gluon_v3_block_n's choice) cannot change a bit."""
    gen = torch.Generator().manual_seed(M * N + K)
    a, b = v3_operands(M, N, K, gen)
    outs = []
    for variant in VARIANTS:
        d = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm._gluon_fp8_v3_gemm(*a, *b, d, variant_config(M, *variant))
        outs.append(d)
    for variant, d in zip(VARIANTS[1:], outs[1:]):
        assert torch.equal(d.view(torch.int16), outs[0].view(torch.int16)), variant


def test_public_api_routes_dense_v3_to_gluon(monkeypatch):
    launches = []
    launch = gemm._gluon_fp8_v3_gemm
    monkeypatch.setattr(gemm, "_gluon_fp8_v3_gemm", lambda *args: launches.append(1) or launch(*args))
    gen = torch.Generator().manual_seed(5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for M, N, routed in ((2048, 128 * -(-sms // 16), True), (256, 384, False)):  # >= one tile per SM; 6 tiles
        a, b = v3_operands(M, N, 256, gen)
        d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        gemm.fp8_gemm_nt(a, b, d)
        assert bool(launches) == routed, (M, N, launches)
        ref = torch.empty_like(d)
        gemm._reference(gemm._DENSE, a, b, ref, None, None, gemm.V3_RECIPE)
        assert calc_diff(d, ref) < 1e-5
        launches.clear()
    # outside its coverage (fp32 output, accumulate-into) a routed shape takes gemm_kernel
    d32 = torch.zeros(2048, 128 * -(-sms // 16), dtype=torch.float32, device="cuda")
    a, b = v3_operands(*d32.shape, 256, gen)
    gemm.fp8_gemm_nt(a, b, d32, c=d32)
    assert not launches
    ref = torch.empty_like(d32)
    gemm._reference(gemm._DENSE, a, b, ref, None, None, gemm.V3_RECIPE)
    assert calc_diff(d32, ref) < 1e-5
