"""Experiment (issue 4, session 37): the contiguous (prefill) FP8 x FP4 MoE kernel at one GPU's prefill shape (384
experts of 32-96 rows), where a 128 x 128 tile's step costs the same ~1,240 cycles as at 128-1,024 rows per expert
while its MMAs are half as many: two changes aimed at what a step then does besides MMAs.

Why: at 384 experts of ~64 rows the kernel runs 366 TFLOP/s against 670 at 128-1,024 rows (session 30), i.e. the
same time per K step (~0.76 us = ~1,240 cycles at the 1,635 MHz power-capped clock) with warpgroup 1 idle on the
all-padding halves. Session 27 located that step time in the converter and the traffic both sides share (L2 and the
SM's memory pipes); its 8-converter-warp variant was neutral at 128-1,024 rows, where the MMAs take twice as long,
and was never timed at the engine's shape.

Variants, each the shipped kernel's loader, converter, math warpgroups and ring (gemm_gluon_fp4_e4m3_kernel) with:
- half_a: a tile whose rows 64-127 are all padding (an expert of at most 64 rows) brings only rows 0-63 of its
  activation tile by TMA (a second descriptor in [64, 128] boxes): 16 of the step's 24 KB of copies;
- conv8: two 4-warp converter partitions, 64 of the step's 128 weight rows each (session 27's exp_moe_contiguous_
  conv8.py, `git show d3006e0:benchmarks/exp_moe_contiguous_conv8.py`), launch registers 96, math 160;
- conv8_half_a: both.
Every output element is the same MMA and promotion, so rows must be bitwise equal to the shipped kernel's.

Measures, per layout (384 of 32-96 rows, 96 of 128-1,024) and GEMM (w13 4,608 x 5,120, w2 5,120 x 2,304), folded
weights and activations folded per 128 (the engine's form), CUDA-graph replay: TFLOP/s of the shipped call (before
and after the variants), each variant, `torch._scaled_grouped_mm` (FP8 rowwise); bitwise equality of the used rows.
Writes $OUT/exp_moe_contiguous_small.json.

    cd benchmarks && python3 exp_moe_contiguous_small.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, PREFILL_LAYOUTS, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import (_E2M1_TO_E4M3_PTX, LUT_HI_BASE, LUT_HI_STEP, LUT_LO_BASE,
                                                      LUT_LO_STEP, _contiguous_convert, _contiguous_math, _raw_words)
from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

# a converter partition's 64 rows of a step, int32 words [64, 16]: a thread converts half a row (8 words)
_HALF_ROW_WORDS = gl.constexpr(gl.BlockedLayout([1, 8], [32, 1], [2, 2], [1, 0]))
VARIANTS = ("half_a", "conv8", "conv8_half_a")


@gluon.jit
def _loads(a_desc, a64_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
           GROUP_M: gl.constexpr, HALF_A: gl.constexpr):
    """gemm_gluon_fp4_e4m3_kernel._contiguous_loads; with HALF_A, a tile whose rows 64-127 are padding (the row the
    second math warpgroup tests) brings only rows 0-63 of its activations."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        top_only = False
        if HALF_A:
            top_only = gl.load(layout_ptr + gl.minimum(off_m + 64, M - 1)) < 0
        if g >= 0:
            for k in range(K // 128):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(raw_ready.index(slot), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(slot),
                                                raw_ring.index(slot))
                if top_only:
                    mbarrier.expect(ready.index(slot), a64_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(a64_desc, [off_m, k * 128], ready.index(slot),
                                                    a_ring.index(slot).slice(0, 64, dim=0))
                else:
                    mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                step += 1


@gluon.jit
def _table_words8(offsets, BASE: gl.constexpr, STEP: gl.constexpr):
    """gemm_gluon_fp4_e4m3_kernel._table_words on _HALF_ROW_WORDS."""
    for_k32 = gl.arange(0, 16, layout=gl.SliceLayout(0, _HALF_ROW_WORDS))[None, :] // 4
    return gl.where(for_k32 == 0, (BASE + (offsets & 0xFF) * STEP)[:, None],
                    gl.where(for_k32 == 1, (BASE + ((offsets >> 8) & 0xFF) * STEP)[:, None],
                             gl.where(for_k32 == 2, (BASE + ((offsets >> 16) & 0xFF) * STEP)[:, None],
                                      (BASE + ((offsets >> 24) & 0xFF) * STEP)[:, None])))


@gluon.jit
def _convert_half(raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M: gl.constexpr,
                  HALF: gl.constexpr):
    """_contiguous_convert for rows [64 HALF, 64 HALF + 64) of each step (4 warps, half a row per thread); each of
    the two converter partitions arrives on "ready"."""
    STAGES: gl.constexpr = raw_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, STAGES)
    num_k = K // 128
    rows = 64 * HALF + gl.arange(0, 64, layout=gl.SliceLayout(1, _HALF_ROW_WORDS))
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)
            offsets, offsets_next = gl.load(row_offsets), gl.load(row_offsets + gl.minimum(1, num_k - 1))
            for k in range(num_k):
                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))
                slot = step % STAGES
                mbarrier.wait(raw_ready.index(slot), (step // STAGES) & 1)
                words = raw_words.index(slot).slice(64 * HALF, 64, dim=0).load(_HALF_ROW_WORDS)
                lo = _table_words8(offsets, LUT_LO_BASE, LUT_LO_STEP)
                hi = _table_words8(offsets, LUT_HI_BASE, LUT_HI_STEP)
                q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [words, lo, hi],
                                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
                b_ring.index(slot).slice(64 * HALF, 64, dim=0).store(gl.reshape(gl.join(q03, q47), [64, 32]))
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                offsets, offsets_next = offsets_next, offsets_after
                step += 1


@gluon.jit
def variant_kernel(a_desc, a64_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
                   stride_sa, stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr, HALF_A: gl.constexpr,
                   CONV8: gl.constexpr, CONVERT_REGS: gl.constexpr, MATH_REGS: gl.constexpr):
    """fp4_e4m3_contiguous_kernel with SA_PER_128, the loader of _loads and, with CONV8, two 4-warp converter
    partitions (the default one and a worker, 64 rows each); launch with num_warps=4."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=3 if CONV8 else 2)  # the TMA's expect-tx and the converters
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    # (the partitions' (function, arguments) pairs cannot be held in variables: each list spells them out)
    if CONV8:
        gl.warp_specialize(
            [(_convert_half, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M, 0)),
             (_convert_half, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M, 1)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
             (_loads, (a_desc, a64_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                       GROUP_M, HALF_A))],
            [4, 4, 4, 1], [CONVERT_REGS, MATH_REGS, MATH_REGS, 24])
    else:
        gl.warp_specialize(
            [(_contiguous_convert, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
             (_loads, (a_desc, a64_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                       GROUP_M, HALF_A))],
            [4, 4, 1], [MATH_REGS, MATH_REGS, 24])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor, variant: str) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on variant_kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    conv8 = variant.startswith("conv8")
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    variant_kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), G._tma_desc(aq, (64, 128)), w_desc, G._tma_desc(d, (64, 128)), d,
        folded.offsets, sa, folded.column_scales, layout, m, n, k, k // 128, d.stride(0), STAGES=4, GROUP_M=8,
        HALF_A=variant.endswith("half_a"), CONV8=conv8, CONVERT_REGS=72, MATH_REGS=160 if conv8 else 200,
        num_warps=4, maxnreg=96 if conv8 else 128)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    for groups, rows_range in PREFILL_LAYOUTS:
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            flops = 2 * sum(rows) * N * K
            row = {"groups": groups, "rows_range": rows_range, "name": name, "N": N, "K": K, "rows": sum(rows)}
            shipped = lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(  # noqa: E731
                a128, (bq, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded)
            shipped()
            row["tflops_shipped"] = flops / ms(shipped) / 1e9
            used = layout >= 0
            for variant in VARIANTS:
                out = torch.empty_like(d)
                call = lambda: launch(a128, bq, folded, out, layout, variant)  # noqa: E731
                call()
                row[f"tflops_{variant}"] = flops / ms(call) / 1e9
                row[f"bitwise_{variant}"] = bool(torch.equal(out[used].view(torch.int16), d[used].view(torch.int16)))
            row["tflops_shipped_again"] = flops / ms(shipped) / 1e9
            row["tflops_scaled_grouped_mm"] = flops / ms(scaled_grouped_mm_peer(a, ends, groups, N, K)) / 1e9
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_small.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        print(f"== {r['groups']} experts of {r['rows_range']} rows, {r['name']}: shipped {r['tflops_shipped']:.0f} / "
              f"{r['tflops_shipped_again']:.0f} TFLOP/s, scaled_grouped_mm {r['tflops_scaled_grouped_mm']:.0f}")
        for variant in VARIANTS:
            print(f"   {variant}: {r[f'tflops_{variant}']:.0f} TFLOP/s, "
                  f"{r[f'tflops_{variant}'] / r['tflops_shipped']:.3f}x shipped, "
                  f"{r[f'tflops_{variant}'] / r['tflops_scaled_grouped_mm']:.2f}x peer, bitwise {r[f'bitwise_{variant}']}")


if __name__ == "__main__":
    main()
