"""The Gluon dense FP8 GEMM of the V4.1 recipe (gemm_gluon_fp8_kernel.fp8_gemm_v41_kernel: the V3 kernel's TMA ring
and producer warp, FP8 wgmma promoted every 32 of K: one m64n32k32 MMA per K block on the 64 x 32 tiles, one
m64n128k32 on the 128 x 128 tiles, each column block's scale picked per register).

Against the pure-torch reference on the same quantized operands (UE8M0 scales per 1 x 32 and 32 x 32, magnitudes
varying per scale block): DeepGEMM's diff below 1e-5 (the products are exact; only the order of the fp32 sums and
the bf16 output rounding differ); a second call is bitwise equal. Shapes: ragged M (65, 100, 1: partial row tiles),
N not a multiple of the 128-column tile (160, 544: a partial B tile and clamped scale blocks), K of one step and of
many (more steps than the ring's stages), V4.1 projection shapes; 128- and 64-row tiles, 128- and 32-column tiles,
one program per tile and persistent programs that run several tiles; the scales as UE8M0 words read by the math
warps, or as fp32 brought through the ring by the producer (session 17).

The kernel claims that every output element is computed the same way whatever the tile shape and the row count of
the call (an MMA over its 32 products per K block, m64n32k32 or m64n128k32, then the same fp32 FMA): checked bitwise
across the variants and against a call on a prefix of the rows. GPU and triton 3.6 only; a hang guard (child process
with a time limit) runs first, as in test_gemm_gluon_fp8.py.
"""

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm._backend import gluon_usable
from mini_deepgemm.testing import block_scaled_operands, calc_diff, run_finishes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not gluon_usable(), reason="needs CUDA and triton 3.6"),
]

SHAPES = [(65, 256, 128), (100, 160, 512), (1, 544, 1280), (300, 1280, 5120), (1000, 544, 1280),
          (257, 4608, 2304), (2048, 5120, 8192)]
# (BLOCK_M, BLOCK_N, ring stages, persistent programs per SM (0 = one program per tile), fp32 scales through the ring)
VARIANTS = [(128, 128, 4, 1, False), (128, 128, 4, 0, False), (64, 128, 4, 2, False), (64, 32, 6, 0, False),
            (128, 128, 4, 1, True), (64, 128, 4, 2, True)]
SMOKE_S = 180


@pytest.fixture(scope="module", autouse=True)
def kernel_finishes():
    """One 256 x 256 x 640 call per variant (five K steps: more than a lap of the ring), and the split-K kernel on 64
    of its rows in one, two and five slices, in a child process that must finish within SMOKE_S."""
    code = f"""
import torch
from mini_deepgemm import gemm
aq = torch.randn(256, 640, device="cuda").to(torch.float8_e4m3fn)
bq = torch.randn(256, 640, device="cuda").to(torch.float8_e4m3fn)
sa = torch.randint(120, 134, (256, 20), dtype=torch.uint8, device="cuda")
sb = torch.randint(120, 134, (8, 20), dtype=torch.uint8, device="cuda")
d = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
for variant in {VARIANTS!r}:
    gemm._gluon_fp8_v41_gemm(aq, sa, bq, sb, d, *variant)
    torch.cuda.synchronize()
for slice_steps, splits in ((5, 1), (3, 2), (1, 5)):
    gemm._gluon_fp8_v41_splitk_gemm(aq[:64], sa[:64], bq, sb, d[:64], slice_steps, splits)
    torch.cuda.synchronize()
"""
    run_finishes(code, SMOKE_S, "the Gluon V4.1 kernels on a 256 x 256 x 640 call")


def v41_operands(M: int, N: int, K: int, gen: torch.Generator):
    """V4.1-recipe operands on the GPU, the UE8M0 scales as uint8 bytes: per 1 x 32 and 32 x 32
    (testing.block_scaled_operands)."""
    aq, sa, bq, sb = block_scaled_operands(M, N, K, 32, "ue8m0", gen)
    return aq.cuda(), sa.view(torch.uint8).cuda(), bq.cuda(), sb.view(torch.uint8).cuda()


def reference_out(aq, sa, bq, sb) -> torch.Tensor:
    e8 = torch.float8_e8m0fnu
    return reference.gemm_nt_ref(aq, sa.view(e8), bq, sb.view(e8), 32, 32)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "%dx%d_s%d_p%d_ring%d" % v)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gluon_v41_matches_reference(M, N, K, variant):
    gen = torch.Generator().manual_seed(M + N + K)
    ops = v41_operands(M, N, K, gen)
    got = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm._gluon_fp8_v41_gemm(*ops, got, *variant)
    again = torch.empty_like(got)
    gemm._gluon_fp8_v41_gemm(*ops, again, *variant)
    assert torch.equal(got.view(torch.int16), again.view(torch.int16)), "repeated calls must be bitwise identical"
    assert calc_diff(got, reference_out(*ops)) < 1e-5


@pytest.mark.parametrize("M,N,K", [(300, 1280, 5120), (1000, 544, 1280)])
def test_a_row_does_not_depend_on_the_tile_or_the_batch(M, N, K):
    gen = torch.Generator().manual_seed(11)
    aq, sa, bq, sb = v41_operands(M, N, K, gen)
    outs = []
    for variant in VARIANTS:
        d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        gemm._gluon_fp8_v41_gemm(aq, sa, bq, sb, d, *variant)
        outs.append(d)
    for variant, d in zip(VARIANTS[1:], outs[1:]):
        assert torch.equal(d.view(torch.int16), outs[0].view(torch.int16)), variant
    for rows in (1, 17, 64):
        d = torch.empty(rows, N, dtype=torch.bfloat16, device="cuda")
        gemm._gluon_fp8_v41_gemm(aq[:rows], sa[:rows], bq, sb, d, 64, 32, 6, 0)
        assert torch.equal(d.view(torch.int16), outs[0][:rows].view(torch.int16)), rows


# (M, N, K) of the split-K kernel: one K step; five steps in two slices; the decode shapes of wkv, wq_a, wo_b, the
# shared expert's w13 and w2 at 1-64 rows (token tiles of 16, 32 and 64; slices of several steps, the last shorter)
SPLITK_SHAPES = [(1, 128, 128), (7, 256, 640), (16, 512, 5120), (33, 1280, 5120), (64, 5120, 8192), (64, 4608, 5120),
                 (40, 5120, 2304)]


@pytest.mark.parametrize("M,N,K", SPLITK_SHAPES)
def test_splitk_matches_reference_and_the_tile_kernels(M, N, K):
    """The split-K kernel (decode sizes): at its routed slices, a second call is bitwise equal and so is the 64 x 32
    tile kernel's output (the same slices, the operands' roles swapped); at one slice and at one slice per K step it
    stays within DeepGEMM's diff of 1e-5 of the reference. The output is a row-strided view (wider rows), as the
    sum kernel and the one-slice stores address it by its stride."""
    gen = torch.Generator().manual_seed(M * 7 + N + K)
    ops = v41_operands(M, N, K, gen)
    want = reference_out(*ops)
    slice_steps, splits = gemm._splitk_slices(N, K)
    for steps, count in ((slice_steps, splits), (K // 128, 1), (1, K // 128)):
        wide = torch.full((M, N + 64), float("nan"), dtype=torch.bfloat16, device="cuda")
        got = wide[:, :N]
        gemm._gluon_fp8_v41_splitk_gemm(*ops, got, steps, count)
        assert wide[:, N:].isnan().all(), "columns past N must be left untouched"
        assert calc_diff(got, want) < 1e-5, (steps, count)
        if (steps, count) == (slice_steps, splits):
            again = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            gemm._gluon_fp8_v41_splitk_gemm(*ops, again, steps, count)
            assert torch.equal(got.view(torch.int16), again.view(torch.int16)), "repeated calls must be bitwise equal"
            tiles = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            gemm._gluon_fp8_v41_gemm(*ops, tiles, 64, 32, 6, 0)
            assert torch.equal(got.view(torch.int16), tiles.view(torch.int16)), "split-K against the 64 x 32 tiles"


@pytest.mark.parametrize("ring", [False, True], ids=["words", "ring"])
@pytest.mark.parametrize("case", ["byte_0", "wide"])
def test_extreme_scale_bytes(case, ring):
    """byte_0: every A scale is byte 0 (2^-127, an fp32 subnormal) and every B scale 2^67, so each product is
    a x b x 2^-60 (a kernel that turned byte 0 into 0 returns zeros); wide: bytes over 2^-30..2^29 on both sides.
    Against an fp64 reference on the CPU (no flush of subnormals)."""
    gen = torch.Generator().manual_seed(3)
    aq, sa, bq, sb = v41_operands(128, 256, 256, gen)
    if case == "byte_0":
        sa, sb = torch.zeros_like(sa), torch.full_like(sb, 127 + 67)
    else:
        sa = torch.randint(97, 157, sa.shape, generator=gen, dtype=torch.uint8).cuda()
        sb = torch.randint(97, 157, sb.shape, generator=gen, dtype=torch.uint8).cuda()
    got = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    gemm._gluon_fp8_v41_gemm(aq, sa, bq, sb, got, 128, 128, 4, 0, ring)
    e8 = torch.float8_e8m0fnu
    a = reference.dequant_operand(aq.cpu(), sa.cpu().view(e8), 1, 32).double()
    b = reference.dequant_operand(bq.cpu(), sb.cpu().view(e8), 32, 32).double()
    want = a @ b.T
    assert want.abs().max() > 0 and torch.isfinite(want).all()
    assert calc_diff(got.cpu(), want) < 1e-5


def test_public_api_routes_dense_v41_to_gluon(monkeypatch):
    """fp8_gemm_nt / fp8_fp4_gemm_nt with FP8 weights and the V4.1 recipe take the Gluon kernels at every row count
    (the split-K kernel at the weight's slices where gemm._splitk_runs picks it; other decode-sized calls on 64 x 32
    tiles, large M on 128 x 128, in calls of at least _V41_RING_MIN_FLOP with the scales through the ring); an fp32
    output, accumulate-into or K % 128 != 0 do not."""
    import mini_deepgemm as dg

    tiles = []
    launch, splitk = gemm._gluon_fp8_v41_gemm, gemm._gluon_fp8_v41_splitk_gemm
    monkeypatch.setattr(gemm, "_gluon_fp8_v41_gemm", lambda *args: tiles.append(args[5:]) or launch(*args))
    monkeypatch.setattr(gemm, "_gluon_fp8_v41_splitk_gemm",
                        lambda *args: tiles.append(("split-K", *args[5:])) or splitk(*args))
    gen = torch.Generator().manual_seed(5)
    e8 = torch.float8_e8m0fnu
    for fn in (dg.fp8_gemm_nt, dg.fp8_fp4_gemm_nt):
        for M, N, K, tile in ((1, 1280, 512, ("split-K", 4, 1)), (64, 1280, 5120, ("split-K", 4, 10)),
                              (32, 4608, 2304, ("split-K", 5, 4)), (64, 4608, 5120, (64, 32, 6, 0, False)),
                              (32, 4608, 1280, (64, 32, 6, 0, False)), (16, 544, 512, (64, 32, 6, 0, False)),
                              (300, 1280, 256, (64, 32, 6, 0, False)),
                              (1000, 4608, 256, (128, 128, 4, 1, False)), (4096, 1280, 256, (128, 128, 4, 1, False)),
                              (4096, 4608, 2560, (128, 128, 4, 1, True))):
            aq, sa, bq, sb = v41_operands(M, N, K, gen)
            d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            fn((aq, sa.view(e8)), (bq, sb.view(e8)), d)
            assert tiles == [tile], (fn.__name__, M, N, tiles)
            assert calc_diff(d, reference_out(aq, sa, bq, sb)) < 1e-5
            tiles.clear()
    aq, sa, bq, sb = v41_operands(256, 256, 256, gen)
    d32 = torch.zeros(256, 256, dtype=torch.float32, device="cuda")
    dg.fp8_gemm_nt((aq, sa.view(e8)), (bq, sb.view(e8)), d32)
    dg.fp8_gemm_nt((aq, sa.view(e8)), (bq, sb.view(e8)), d32, c=d32)
    aq, sa, bq, sb = v41_operands(256, 256, 160, gen)
    d = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
    dg.fp8_gemm_nt((aq, sa.view(e8)), (bq, sb.view(e8)), d)
    assert not tiles
    assert calc_diff(d, reference_out(aq, sa, bq, sb)) < 1e-5
