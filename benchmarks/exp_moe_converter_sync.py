"""Experiment (issue 4, session 38): the contiguous (prefill) FP8 x FP4 MoE kernel's converter, decoupled from the
ring it shares with the math warpgroups, in two ways that session 37's profile left untried.

Why: at one GPU's prefill shape (384 experts of 32-96 rows) a 128 x 128 tile's K step takes ~1,100-1,250 cycles. The
conversion alone (no MMAs) takes 0.76 of the kernel's time and the MMAs alone (no conversion) 0.72: the two add up
instead of overlapping (docs/reports/deepgemm-moe-fold-128.md, session 37). Math warpgroup 0 polls "ready" 29% of its
samples; the converter waits on its fence and the partition barrier before its single arrival (12%), on the raw
weights' TMA (9%) and issues in only 13% of its samples. Two couplings remain that no variant has removed:
- raw weights ride the same 4-slot ring as the activations: the producer brings step s's packed weights only once
  the math warpgroups released slot s % 4, so the converter can run at most one ring ahead of the MMAs and every
  packed weight tile's TMA latency (from DRAM, read once per expert) sits inside that window;
- the converter's four warps meet at a partition barrier every step (only one thread arrives on "ready"), so the
  slowest warp of each step sets the pace.

Variants, each the shipped kernel (gemm_gluon_fp4_e4m3_kernel.fp4_e4m3_contiguous_kernel, SA_PER_128) with:
- raw8: the packed weights in a ring of their own, 8 deep (8 KB a slot), brought by a second loader warp as soon as
  the converter has read the slot 8 steps back; the converter waits for "empty" only before it stores the e4m3 tile.
- warp4: four 1-warp converter partitions (32 weight rows each), each fenced and arriving on "ready" for its rows
  ("ready" counts the activations' TMA and four arrivals); math warpgroup 0 is the default partition.
- raw8_warp4: both.
Every output element is the same MMA chain and promotion, so the used rows must be bitwise equal to the shipped
kernel's.

Measures, per layout (384 of 32-96 rows, 96 of 128-1,024) and GEMM (w13 4,608 x 5,120, w2 5,120 x 2,304), folded
weights and activations folded per 128 (the engine's form), CUDA-graph replay: TFLOP/s of the shipped call (before
and after the variants), each variant, `torch._scaled_grouped_mm` (FP8 rowwise); bitwise equality of the used rows.
Writes $OUT/exp_moe_converter_sync.json.

    cd benchmarks && python3 exp_moe_converter_sync.py
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
                                                      LUT_LO_STEP, _contiguous_math, _raw_words)
from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

VARIANTS = tuple(os.environ.get("VARIANTS", "raw8,warp4,raw8_warp4").split(","))
# raw8 with its raw-slot release changed, to find why its rows differ (session 38, run 2): after a proxy fence, or
# only once the B tile is stored
RAW_RELEASE = {"raw8_fence": 1, "raw8_late": 2}
RAW_STAGES = 8


@gluon.jit
def _a_loads(a_desc, a_ring, ready, empty, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """Loader warp 1: per step, once the slot is empty, the activation tile into "ready"."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        if gl.load(layout_ptr + off_m) >= 0:
            for k in range(K // 128):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                step += 1


@gluon.jit
def _raw_loads(w_desc, raw_ring, raw_ready, raw_empty, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """Loader warp 2: per step, once the converters have read the raw slot's previous tile, the packed weights."""
    RAW: gl.constexpr = raw_ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            for k in range(K // 128):
                rs = step % RAW
                mbarrier.wait(raw_empty.index(rs), ((step // RAW) & 1) ^ 1)
                mbarrier.expect(raw_ready.index(rs), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(rs),
                                                raw_ring.index(rs))
                step += 1


@gluon.jit
def _shared_loads(a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                  GROUP_M: gl.constexpr):
    """The shipped producer (gemm_gluon_fp4_e4m3_kernel._contiguous_loads): both tiles per step into one ring."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            for k in range(K // 128):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(raw_ready.index(slot), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(slot),
                                                raw_ring.index(slot))
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                step += 1


@gluon.jit
def _table_words(offsets, BASE: gl.constexpr, STEP: gl.constexpr, LAYOUT: gl.constexpr):
    """gemm_gluon_fp4_e4m3_kernel._table_words on LAYOUT ([rows, 16] words, one row per thread)."""
    for_k32 = gl.arange(0, 16, layout=gl.SliceLayout(0, LAYOUT))[None, :] // 4
    return gl.where(for_k32 == 0, (BASE + (offsets & 0xFF) * STEP)[:, None],
                    gl.where(for_k32 == 1, (BASE + ((offsets >> 8) & 0xFF) * STEP)[:, None],
                             gl.where(for_k32 == 2, (BASE + ((offsets >> 16) & 0xFF) * STEP)[:, None],
                                      (BASE + ((offsets >> 24) & 0xFF) * STEP)[:, None])))


@gluon.jit
def _convert(raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
             GROUP_M: gl.constexpr, ROWS: gl.constexpr, ROW0: gl.constexpr, OWN_RAW: gl.constexpr,
             RELEASE: gl.constexpr = 0):
    """A converter partition of ROWS // 32 warps (one weight row per thread) for rows [ROW0, ROW0 + ROWS) of each
    step. OWN_RAW: the raw tile is in a ring of its own: release its slot once read (RELEASE 0; 1: after a proxy
    fence; 2: only after the B tile is stored and announced), and wait for the B slot's "empty" before storing (the
    shipped producer waited for it before bringing the raw tile)."""
    LAYOUT: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [ROWS // 32, 1], [1, 0])
    STAGES: gl.constexpr = b_ring.type.shape[0]
    RAW: gl.constexpr = raw_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, RAW)
    num_k = K // 128
    rows = ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
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
                rs = step % RAW
                mbarrier.wait(raw_ready.index(rs), (step // RAW) & 1)
                words = raw_words.index(rs).slice(ROW0, ROWS, dim=0).load(LAYOUT)
                lo = _table_words(offsets, LUT_LO_BASE, LUT_LO_STEP, LAYOUT)
                hi = _table_words(offsets, LUT_HI_BASE, LUT_HI_STEP, LAYOUT)
                q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [words, lo, hi],
                                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
                tile_words = gl.reshape(gl.join(q03, q47), [ROWS, 32])
                if OWN_RAW:
                    if RELEASE == 1:
                        fence_async_shared()
                    if RELEASE < 2:
                        mbarrier.arrive(raw_empty.index(rs), count=1)
                    mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                b_ring.index(slot).slice(ROW0, ROWS, dim=0).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                if OWN_RAW and RELEASE == 2:
                    mbarrier.arrive(raw_empty.index(rs), count=1)
                offsets, offsets_next = offsets_next, offsets_after
                step += 1


@gluon.jit
def variant_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K, stride_sa,
                   stride_d, STAGES: gl.constexpr, RAW: gl.constexpr, GROUP_M: gl.constexpr,
                   WARP4: gl.constexpr, OWN_RAW: gl.constexpr, RELEASE: gl.constexpr):
    """fp4_e4m3_contiguous_kernel with SA_PER_128 and the converter of the variant (module docstring); launch with
    num_warps=4 and maxnreg 128. With WARP4 math warpgroup 0 is the default partition (200 registers) and the four
    1-warp converters must fill one warpgroup of their own: Triton places partitions by size, largest first, then in
    list order, with its padding partitions (24 registers) among them by size, and a warpgroup takes the largest
    request of its members; so the loaders come first (one of 2 warps where that fills a warpgroup with the
    padding) and the default keeps 512 - 200 - 88 - 24 = 200 registers (checked offline on the PTX)."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [RAW, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [RAW, 1], mbarrier.MBarrierLayout())
    raw_empty = gl.allocate_shared_memory(gl.int64, [RAW, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=5 if WARP4 else 2)  # the activations' TMA and the converter arrivals
        mbarrier.init(empty.index(s), count=2)
    for s in gl.static_range(RAW):
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(raw_empty.index(s), count=4 if WARP4 else 1)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    # (the partitions' (function, arguments) pairs cannot be held in variables: each list spells them out)
    if WARP4:
        if OWN_RAW:
            gl.warp_specialize(
                [(_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                     colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
                 (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                     colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
                 (_a_loads, (a_desc, a_ring, ready, empty, layout_ptr, M, N, K, GROUP_M)),
                 (_raw_loads, (w_desc, raw_ring, raw_ready, raw_empty, layout_ptr, M, N, K, GROUP_M)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 0, True)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 32, True)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 64, True)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 96, True))],
                [4, 1, 1, 1, 1, 1, 1], [200, 24, 24, 88, 88, 88, 88])
        else:
            gl.warp_specialize(
                [(_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                     colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
                 (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                     colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
                 (_shared_loads, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                                  GROUP_M)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 0, False)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 32, False)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 64, False)),
                 (_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                             GROUP_M, 32, 96, False))],
                [4, 2, 1, 1, 1, 1], [200, 24, 88, 88, 88, 88])
    else:
        gl.warp_specialize(
            [(_convert, (raw_ring, b_ring, ready, raw_ready, raw_empty, empty, offsets_ptr, layout_ptr, M, N, K,
                         GROUP_M, 128, 0, True, RELEASE)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                 colscale_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
             (_a_loads, (a_desc, a_ring, ready, empty, layout_ptr, M, N, K, GROUP_M)),
             (_raw_loads, (w_desc, raw_ring, raw_ready, raw_empty, layout_ptr, M, N, K, GROUP_M))],
            [4, 4, 1, 1], [200, 200, 24, 24])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    for s in gl.static_range(RAW):
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(raw_empty.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor, variant: str) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on variant_kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    warp4, own_raw = "warp4" in variant, variant.startswith("raw8")
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    variant_kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), w_desc, G._tma_desc(d, (64, 128)), d, folded.offsets, sa,
        folded.column_scales, layout, m, n, k, k // 128, d.stride(0), STAGES=4, RAW=RAW_STAGES if own_raw else 4,
        GROUP_M=8, WARP4=warp4, OWN_RAW=own_raw, RELEASE=RAW_RELEASE.get(variant, 0), num_warps=4, maxnreg=128)


def profile_call(variant: str):
    """profile_ncu.py's case exp_moe_converter_sync:profile_call:VARIANT: one call of VARIANT ("shipped": the
    package's call) at profile_ncu's moe384_w13_fold128 shape (384 experts of 32-96 rows, w13, seed 0)."""
    rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(384, *dict(
        (name, (N, K)) for name, N, K in MOE_SHAPES)["w13"], torch.Generator().manual_seed(0), (32, 96))
    sb = rand_fp4_weight_scales(384, d.shape[1], a.shape[1] // 32, low=118)
    folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
    if variant == "shipped":
        return lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a128, (bq, sb), d, layout,
                                                              weight_scale_max=FP4_SCALE_BOUND, folded=folded)
    return lambda: launch(a128, bq, folded, d, layout, variant)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    for groups, rows_range in reversed(PREFILL_LAYOUTS):  # the engine's shape first
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
                try:
                    call()
                    torch.cuda.synchronize()
                    differs = (out[used].view(torch.int16) != d[used].view(torch.int16)).any(dim=1)
                    row[f"bitwise_{variant}"] = not bool(differs.any())
                    row[f"differing_rows_{variant}"] = int(differs.sum())  # of the used rows, to locate a race
                    row[f"tflops_{variant}"] = flops / ms(call) / 1e9
                except Exception as e:  # noqa: BLE001 - one variant failing to build must not hide the others
                    row[f"error_{variant}"] = repr(e)[:400]
                    row[f"tflops_{variant}"] = float("nan")
                    row[f"bitwise_{variant}"] = None
            row["tflops_shipped_again"] = flops / ms(shipped) / 1e9
            row["tflops_scaled_grouped_mm"] = flops / ms(scaled_grouped_mm_peer(a, ends, groups, N, K)) / 1e9
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_converter_sync.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        print(f"== {r['groups']} experts of {r['rows_range']} rows, {r['name']}: shipped {r['tflops_shipped']:.0f} / "
              f"{r['tflops_shipped_again']:.0f} TFLOP/s, scaled_grouped_mm {r['tflops_scaled_grouped_mm']:.0f}")
        for variant in VARIANTS:
            print(f"   {variant}: {r[f'tflops_{variant}']:.0f} TFLOP/s, "
                  f"{r[f'tflops_{variant}'] / r['tflops_shipped']:.3f}x shipped, "
                  f"{r[f'tflops_{variant}'] / r['tflops_scaled_grouped_mm']:.2f}x peer, "
                  f"bitwise {r[f'bitwise_{variant}']} "
                  f"({r.get(f'differing_rows_{variant}')} of {r['rows']} rows differ)")


if __name__ == "__main__":
    main()
