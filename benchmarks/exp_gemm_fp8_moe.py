"""Experiment (issue 4, session 19): the MoE prefill GEMM (contiguous layout, FP8 activations x FP4 expert weights) on
FP8 tensor cores, the weights converted e2m1 -> e4m3 in shared memory with their scales folded in.

Why (docs/reports/deepgemm-gluon-v41.md, "counted, not built"): the shipped MoE GEMMs convert the weights to bf16
and run bf16 MMAs, whose rate caps them near cuBLAS bf16, below the issue's target (1.0x `torch._scaled_grouped_mm`
FP8). On FP8 MMAs the activations' 1 x 32 scales still need one FMA per accumulator element and 32 of K (as the V4.1
dense kernel), but the weights' 1 x 32 scales can leave the loop: e2m1 x 2^d is exact in e4m3 for d in [-8, 6], so
each weight row (an output column n) gets one reference exponent ref[n] = max over K of its scale exponent - 6, its
values are converted to e4m3 x 2^(e - ref[n]), and 2^(ref[n] - 127) multiplies the column once in the epilogue.
Here d = e - ref[n] must lie in [-5, 6] (a row's scale bytes span at most 11): then the conversion's table is two
words built with two integer multiply-adds per row and 32 of K (below -5 the 0.5 entry turns subnormal and breaks
the arithmetic). A weight tensor with a wider row goes to the shipped bf16 kernel (checked once, at load).

How (one persistent CTA per SM, 128 x 128 output tiles, K in steps of 128, a 4-deep ring):
- a producer warp issues, per step and once the ring slot is empty, the activation tile [128, 128] and the tile's
  packed weight rows [128, 64 bytes] by TMA;
- the default partition (4 warps) converts: per step it waits for the slot's packed weights, loads them from shared
  memory as int32 words (one row per thread), builds each row's table from its offset byte (loaded from global
  memory two steps ahead), converts 8 values per word (inline PTX: two byte permutes through the row's table for the
  magnitudes, two more for the signs), stores the e4m3 tile into the slot (128-byte swizzle, the layout the TMA
  would give), fences, and arrives on the slot's "ready" barrier (2 arrivals: the activation TMA's expect-tx and
  this);
- two math warpgroups (workers), 64 rows each, as the V4.1 dense kernel: per 32 of K an m64n128k32 MMA (A fragment
  from shared memory by ldmatrix, B the converted tile) into a fresh tile, then acc += part * sa[m, kb]; the
  epilogue multiplies by the columns' 2^(ref - 127) and stores by TMA.
Version 1 (run 4, commit 2331496) had no producer warp: the converter loaded the weights from global memory one step
ahead and issued the activation TMA itself. It ran 0.71-0.72x the shipped kernel, and its converter alone (the math
warpgroups only waiting) took 85% of its time: the loads' latency, one step ahead, was not hidden.
Every product is exact (e4m3 x e4m3); against the reference (bf16 dequantization, fp32 sums) the sums differ in
order and in the tensor core's accumulation of 32 products, as the V4.1 kernel's. The shipped FP4 kernels are
bitwise equal across layouts (decode and prefill); this one is not equal to them, so shipping it would mean moving
the masked and dense FP4 paths with it.

Not done here (an experiment): padding rows (-1) inside an expert's last tile are written (the API leaves them
untouched), and the activation pass the shipped kernel runs first is not needed (FP8 activations go to the MMA as
they are), which the whole-call comparison below includes.

Measured here: whole calls at bench_deepgemm's MoE shapes (96 / 192 experts, 128-1,024 rows each, w13 and w2),
GPU time by CUDA-graph replay, against the shipped kernel (activation pass + bf16-MMA GEMM) and
`torch._scaled_grouped_mm` (FP8 rowwise) in the same process; the diff metric against the shipped kernel's output on
every valid row and against the reference on a small case. Writes $OUT/exp_gemm_fp8_moe.json.

    cd benchmarks && timeout 400 python3 exp_gemm_fp8_moe.py
"""

from __future__ import annotations

import json
import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets, _ue8m0_to_f32

# e4m3 bytes of {0, 0.5, 1, 1.5} x 2^d (low word) and {2, 3, 4, 6} x 2^d (high word) for d = -5: a step of d adds 8
# (one exponent step) to every byte but the zero's.
LUT_LO_BASE: gl.constexpr = gl.constexpr(0x14100800)
LUT_LO_STEP: gl.constexpr = gl.constexpr(0x08080800)
LUT_HI_BASE: gl.constexpr = gl.constexpr(0x24201C18)
LUT_HI_STEP: gl.constexpr = gl.constexpr(0x08080808)
D_MIN, D_MAX = -5, 6
# the packed weight tiles [128 rows, 64 bytes]: a 64-byte swizzle, so the converter's row-per-thread 16-byte loads
# hit distinct banks
RAW_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)

# $2: 8 packed e2m1 values (value i in bits 4i..4i+3), $3 / $4: the row's table -> $0: values 0-3 as e4m3 bytes, $1:
# values 4-7. prmt picks byte (selector nibble & 7) of {$4, $3}: the magnitudes (sign bits cleared) index the table.
# The signs, bit 4i + 3, must become bit 7 of byte i: w << 4 holds the even values' signs at its bytes' top bits and
# w the odd values', so a byte permute with a constant selector interleaves them and one AND-OR adds them (9
# instructions per 8 values; version 1's nibble-to-byte sign spread took 11 and a constant per permute).
_E2M1_TO_E4M3_PTX: gl.constexpr = gl.constexpr("""
{
.reg .b32 m, t, w4;
and.b32 m, $2, 0x77777777;
prmt.b32 $0, $3, $4, m;
shr.u32 m, m, 16;
prmt.b32 $1, $3, $4, m;
shl.b32 w4, $2, 4;
prmt.b32 t, w4, $2, 0x5140;
and.b32 t, t, 0x80808080;
or.b32 $0, $0, t;
prmt.b32 t, w4, $2, 0x7362;
and.b32 t, t, 0x80808080;
or.b32 $1, $1, t;
}
""")


@gluon.jit
def _load_partition(a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                    GROUP_M: gl.constexpr):
    """One warp: per step of this program's tiles, once the ring slot is empty, the activation tile [128, 128] (into
    "ready", with the converter's arrival) and the packed weight rows [128, 64 bytes] (into "raw_ready") by TMA."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    num_k = K // 128
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            for k in range(num_k):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(raw_ready.index(slot), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(slot),
                                                raw_ring.index(slot))
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                step += 1


@gluon.jit
def _convert_partition(raw_words, b_ring, ready, raw_ready, sd_ptr, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """The default partition (4 warps): per step, once its packed weights are in the ring, converts them into the
    slot's e4m3 tile and arrives on "ready" (module docstring). raw_words: the packed slot as int32 [128, 16];
    sd_ptr: int32 words of the offset bytes d + 5 [G, N, K / 128], loaded two steps ahead."""
    STAGES: gl.constexpr = raw_words.type.shape[0]
    words: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])  # a thread: one row's 16 words a step
    rows_layout: gl.constexpr = gl.SliceLayout(1, words)
    num_k = K // 128
    rows = gl.arange(0, 128, layout=rows_layout)
    col = gl.arange(0, 16, layout=gl.SliceLayout(0, words))[None, :]
    for_k32 = col // 4  # the word's 32-block of the step: a constant of its register, so the selects below fold
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            sd_rows = sd_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)
            sd, sd_next = gl.load(sd_rows), gl.load(sd_rows + gl.minimum(1, num_k - 1))
            for k in range(num_k):
                sd_after = gl.load(sd_rows + gl.minimum(k + 2, num_k - 1))
                lo0 = LUT_LO_BASE + (sd & 0xFF) * LUT_LO_STEP
                lo1 = LUT_LO_BASE + ((sd >> 8) & 0xFF) * LUT_LO_STEP
                lo2 = LUT_LO_BASE + ((sd >> 16) & 0xFF) * LUT_LO_STEP
                lo3 = LUT_LO_BASE + ((sd >> 24) & 0xFF) * LUT_LO_STEP
                hi0 = LUT_HI_BASE + (sd & 0xFF) * LUT_HI_STEP
                hi1 = LUT_HI_BASE + ((sd >> 8) & 0xFF) * LUT_HI_STEP
                hi2 = LUT_HI_BASE + ((sd >> 16) & 0xFF) * LUT_HI_STEP
                hi3 = LUT_HI_BASE + ((sd >> 24) & 0xFF) * LUT_HI_STEP
                lo = gl.where(for_k32 == 0, lo0[:, None], gl.where(for_k32 == 1, lo1[:, None],
                                                                   gl.where(for_k32 == 2, lo2[:, None], lo3[:, None])))
                hi = gl.where(for_k32 == 0, hi0[:, None], gl.where(for_k32 == 1, hi1[:, None],
                                                                   gl.where(for_k32 == 2, hi2[:, None], hi3[:, None])))
                slot = step % STAGES
                mbarrier.wait(raw_ready.index(slot), (step // STAGES) & 1)
                w = raw_words.index(slot).load(words)
                q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [w, lo, hi],
                                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
                tile_words = gl.reshape(gl.join(q03, q47), [128, 32])
                # the slot's B tile is free: the producer waited for "empty" before this step's weights
                b_ring.index(slot).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                sd, sd_next = sd_next, sd_after
                step += 1


@gluon.jit
def _math_partition(a_ring, b_ring, ready, empty, d_desc, d_smem, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
                    stride_sa, GROUP_M: gl.constexpr, ROW0: gl.constexpr):
    """Rows [ROW0, ROW0 + 64) of every tile: per 32 of K one m64n128k32 MMA and acc += part * sa (module docstring);
    sa_ptr: int32 words of the activations' UE8M0 bytes [M, K / 32] (row stride stride_sa words)."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    num_k = K // 128
    zero = gl.zeros([64, 128], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            offs_m = gl.minimum(off_m + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma)), M - 1)
            sa_rows = sa_ptr + offs_m.to(gl.int64) * stride_sa
            wa = gl.load(sa_rows)
            acc = gl.zeros([64, 128], gl.float32, mma)
            for k in range(num_k):
                wa_next = gl.load(sa_rows + gl.minimum(k + 1, num_k - 1))
                slot = step % STAGES
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                a_tile = a_ring.index(slot).slice(ROW0, 64, dim=0)
                b_tile = b_ring.index(slot)
                for j in gl.static_range(4):
                    a_frag = a_tile.slice(32 * j, 32, dim=1).load(a_op)
                    part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                        a_frag, b_tile.slice(32 * j, 32, dim=1).permute((1, 0)), zero, use_acc=False, is_async=True),))
                    acc = acc + part * _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)[:, None]
                mbarrier.arrive(empty.index(slot), count=1)
                wa = wa_next
                step += 1
            cols = gl.minimum(off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, mma)), N - 1)
            acc = acc * gl.load(colscale_ptr + g * N + cols)[None, :]
            tma.store_wait(pendings=0)
            d_smem.store(acc.to(d_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(d_desc, [off_m + ROW0, off_n], d_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_fp4_contiguous_fp8mma_kernel(a_desc, w_desc, d_desc, sd_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
                                     stride_sa, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                                     CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """d[m, n] = colscale[g, n] * sum over 32-blocks kb of sa[m, kb] * (a[m, kb] . w'[g, n, kb]), g = layout[m], w'
    the e4m3 conversion of the packed e2m1 weights with 2^(d[g, n, kb]) folded in. a_desc: e4m3 [M, K] in
    [128, 128] boxes; w_desc: the packed weights as uint8 [G * N, K / 2] in [128, 64] boxes (64-byte swizzle);
    d_desc: bf16 [M, N] in [64, 128] boxes; K % 128 == 0. Launch with num_warps=4 (the converter, the default
    partition) and maxnreg 128 (16 warps: the producer warp takes a warpgroup of its own); the math warpgroups get
    CONSUMER_REGS, the producer PRODUCER_REGS, the converter what is left."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    raw_words = raw_ring._reinterpret(gl.int32, [STAGES, 128, 16],
                                      gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2))
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=2)  # the activation TMA's expect-tx and the converter's arrival
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one per math warpgroup
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    gl.warp_specialize(
        [(_convert_partition, (raw_words, b_ring, ready, raw_ready, sd_ptr, layout_ptr, M, N, K, GROUP_M)),
         (_math_partition, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), sa_ptr, colscale_ptr,
                            layout_ptr, M, N, K, stride_sa, GROUP_M, 0)),
         (_math_partition, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), sa_ptr, colscale_ptr,
                            layout_ptr, M, N, K, stride_sa, GROUP_M, 64)),
         (_load_partition, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                            GROUP_M))],
        [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))


# ---------------------------------------------------------------------------------------------------- host side


def fold_weight_scales(sb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per weight row (expert g, output column n) of UE8M0 scale bytes sb [G, N, K / 32]: (the offset bytes d + 5 as
    int32 words [G, N, K / 128], the column scales 2^(ref - 127) fp32 [G, N]), ref = max over K - 6. Raises if a
    row's bytes span more than D_MAX - D_MIN (the shipped kernel's case) or a reference exponent leaves fp32's
    normal range."""
    e = sb.view(torch.uint8).to(torch.int32)
    ref = e.amax(-1) - D_MAX
    d = e - ref[..., None]
    if int(d.min()) < D_MIN:
        raise ValueError(f"a weight row's scale bytes span {int((e.amax(-1) - e.amin(-1)).max())} > {D_MAX - D_MIN}")
    if int(ref.min()) < 1:
        raise ValueError("a reference exponent below 2^-126")
    colscale = torch.ldexp(torch.ones_like(ref, dtype=torch.float32), (ref - 127).to(torch.float32))
    return (d - D_MIN).to(torch.uint8).contiguous().view(torch.int32), colscale


def fp8_fp4_contiguous_fp8mma(a: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, folded, layout: torch.Tensor,
                              d: torch.Tensor, stages: int = 4, consumer_regs: int = 192) -> None:
    """d = the contiguous grouped GEMM of e4m3 a [M, K] (UE8M0 sa [M, K / 32]) and packed e2m1 bq [G, N, K / 2]
    (contiguous) with fold_weight_scales' `folded`."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm import gemm as G
    from mini_deepgemm._backend import cdiv, sm_count

    M, K = a.shape
    G_, N, K2 = bq.shape
    sd, colscale = folded
    tiles = cdiv(M, 128) * cdiv(N, 128)
    w_desc = TensorDescriptor.from_tensor(bq.view(G_ * N, K2), [128, 64], RAW_LAYOUT)
    fp8_fp4_contiguous_fp8mma_kernel[(min(tiles, sm_count(a.device)),)](
        G._tma_desc(a, (128, 128)), w_desc, G._tma_desc(d, (64, 128)), sd, sa.view(torch.uint8).view(torch.int32),
        colscale, layout, M, N, K, K // 128, STAGES=stages, GROUP_M=8, CONSUMER_REGS=consumer_regs,
        PRODUCER_REGS=24, num_warps=4, maxnreg=128)


# ---------------------------------------------------------------------------------------------------- measurement


def moe_case(G_, N, K, seed):
    """bench_deepgemm's contiguous operands with the weights' scale bytes drawn from 118-128 (a span of 10, which
    fold_weight_scales takes; bench_deepgemm draws 116-128)."""
    from bench_deepgemm import contiguous_operands  # beside this script

    gen = torch.Generator().manual_seed(seed)
    rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(G_, N, K, gen)
    sb = torch.randint(118, 129, (G_, N, K // 32), dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)
    return rows, layout, ends, M, a, sa, bq, sb, d


def shipped_config(a, bq) -> dict:
    """The config the package routes this FP4 contiguous call to (the warp-specialized bf16-MMA Gluon kernel)."""
    from mini_deepgemm import gemm as G

    return G.default_config(G._CONTIGUOUS, a.shape[0], 32, True, n=bq.shape[1], groups=bq.shape[0], fp4=True)


def shipped_call(a, sa, bq, sb, layout, d):
    from bench_deepgemm import FP4_SCALE_BOUND
    from mini_deepgemm import gemm as G

    cfg = shipped_config(a, bq)
    return lambda: G._gemm(G._CONTIGUOUS, (a, sa), (bq, sb), d, None, layout, None, True, config=cfg,
                           weight_scale_max=FP4_SCALE_BOUND)


def shipped_gemm_only(a, sa, bq, sb, layout, d):
    """The shipped call's GEMM without its activation pass (bf16 activations made once, outside the timing)."""
    from mini_deepgemm import gemm as G

    cfg = shipped_config(a, bq)
    x = G._dequant_activations(a, sa.view(torch.uint8), True, grouped_layout=layout)
    return lambda: G._gluon_fp4_contiguous_ws_gemm(x, bq, sb.view(torch.uint8), d, layout, cfg["GLUON_STAGES"], True)


# Breakdown variants (timed only; their outputs are wrong by construction): the converter stores each row's table
# words instead of converting (its shared-memory loads and the conversion drop out; the producer still brings the
# bytes), or the math warpgroups skip their MMAs and promotion (they only wait for each slot and release it).
NO_CONVERT = ("\n                tile_words = gl.reshape(gl.join(q03, q47), [128, 32])",
              "\n                tile_words = gl.reshape(gl.join(lo, hi), [128, 32])")
NO_MATH = ("for j in gl.static_range(4):\n                    a_frag",
           "for j in gl.static_range(0):\n                    a_frag")


def breakdown_variants(workdir: str) -> dict:
    import sys

    from source_variants import edited_module

    this = sys.modules[__name__]
    return {"no_convert": edited_module(this, [NO_CONVERT], "fp8_moe_no_convert", workdir),
            "no_math": edited_module(this, [NO_MATH], "fp8_moe_no_math", workdir)}


def valid_diff(x: torch.Tensor, y: torch.Tensor, layout: torch.Tensor) -> float:
    from mini_deepgemm.testing import calc_diff

    keep = layout >= 0
    return float(calc_diff(x[keep].float(), y[keep].float()))


def smoke(queue) -> None:
    """A small case against the reference (in a child: a handover mistake hangs rather than fails)."""
    from mini_deepgemm import reference

    torch.manual_seed(0)
    rows, layout, ends, M, a, sa, bq, sb, d = moe_case(4, 384, 512, 1)
    folded = fold_weight_scales(sb)
    fp8_fp4_contiguous_fp8mma(a, sa, bq, folded, layout, d)
    torch.cuda.synchronize()
    ref = reference.m_grouped_gemm_nt_contiguous_ref(a, sa, bq, sb, layout, 1, 32)
    d2 = torch.empty_like(d)
    shipped_call(a, sa, bq, sb, layout, d2)()
    queue.put({"diff_vs_reference": valid_diff(d, ref, layout), "shipped_vs_reference": valid_diff(d2, ref, layout)})


def main() -> None:
    import tempfile

    from bench_flashmla import environment
    from exp_gemm_gluon_v3 import ms, smoke_in_child

    out_dir = os.environ.get("OUT", ".")
    first = smoke_in_child(smoke, 150, "the FP8-MMA MoE kernel's smoke case")
    print("smoke:", first, flush=True)
    result = {"environment": environment(torch.device("cuda")), "smoke": first, "rows": []}
    workdir = tempfile.mkdtemp()
    variants = breakdown_variants(workdir)
    for G_ in (96, 192):
        for name, N, K in (("w13", 4608, 5120), ("w2", 5120, 2304)):
            rows, layout, ends, M, a, sa, bq, sb, d = moe_case(G_, N, K, 7)
            flops = 2 * sum(rows) * N * K
            folded = fold_weight_scales(sb)
            ours = lambda: fp8_fp4_contiguous_fp8mma(a, sa, bq, folded, layout, d)  # noqa: E731
            d_ship = torch.empty_like(d)
            shipped = shipped_call(a, sa, bq, sb, layout, d_ship)
            ours(), shipped()
            torch.cuda.synchronize()
            row = {"G": G_, "name": name, "N": N, "K": K, "rows": sum(rows), "padded_rows": M,
                   "diff_vs_shipped": valid_diff(d, d_ship, layout)}
            t = {"fp8mma": ms(ours), "shipped": ms(shipped),
                 "shipped_gemm_only": ms(shipped_gemm_only(a, sa, bq, sb, layout, torch.empty_like(d)))}
            for vname, module in variants.items():
                t[vname] = ms(lambda: module.fp8_fp4_contiguous_fp8mma(a, sa, bq, folded, layout, d))
            w8 = (torch.randn(G_, N, K, device="cuda") * 4).to(torch.float8_e4m3fn)
            s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(G_, N, device="cuda") + 0.5
            t["scaled_grouped_mm_fp8"] = ms(lambda: torch._scaled_grouped_mm(
                a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16))
            w8 = None  # frees it before the next case (a rebinding: the timed lambda has run)
            row.update({f"tflops_{k}": flops / v / 1e9 for k, v in t.items()})
            row.update({f"us_{k}": v * 1e3 for k, v in t.items()})
            row["speedup_vs_shipped"] = t["shipped"] / t["fp8mma"]
            row["ratio_vs_scaled_grouped_mm"] = t["scaled_grouped_mm_fp8"] / t["fp8mma"]
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
    print("| experts | GEMM | rows | TFLOP/s fp8mma | shipped | shipped GEMM alone | scaled_grouped_mm | speed-up | "
          "ratio to scaled_grouped_mm | diff vs shipped | us: fp8mma / no_convert / no_math |")
    for r in result["rows"]:
        print(f"| {r['G']} | {r['name']} | {r['rows']} | {r['tflops_fp8mma']:.0f} | {r['tflops_shipped']:.0f} | "
              f"{r['tflops_shipped_gemm_only']:.0f} | {r['tflops_scaled_grouped_mm_fp8']:.0f} | "
              f"{r['speedup_vs_shipped']:.2f} | {r['ratio_vs_scaled_grouped_mm']:.2f} | {r['diff_vs_shipped']:.1e} | "
              f"{r['us_fp8mma']:.0f} / {r['us_no_convert']:.0f} / {r['us_no_math']:.0f} |")
    with open(os.path.join(out_dir, "exp_gemm_fp8_moe.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
