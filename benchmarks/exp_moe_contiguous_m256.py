"""Experiment (issue 4, session 38): the contiguous (prefill) FP8 x FP4 MoE kernel on 256-row tiles, so that each
converted weight tile feeds 256 activation rows instead of 128.

Why: at 96 experts of 128-1,024 rows the kernel runs 0.85x (w13) / 0.95x (w2) `torch._scaled_grouped_mm`. Without
its conversion it ran 1.37x faster (session 23), yet a converter of twice the warps (session 37: conv8, 0.98-1.00x)
and 128 x 256 tiles (session 22: 1.00x; twice the FLOPs per handshake, the same conversions per FLOP) did not
move it. No variant has changed the conversions per FLOP: every 128 x 128 tile converts its 128 weight rows for 128
activation rows, so an expert of ~576 rows converts each of its weight tiles ~4.5 times. A 256-row tile halves
that. Whether the kernel gains says whether the conversion's volume, rather than the chain of handshakes, is what
sets the step.

How (variant_kernel; everything else as the shipped fp4_e4m3_contiguous_kernel, SA_PER_128):
- tiles of 256 x 128 over a layout whose expert segments are 256-aligned (a tile is one expert's or padding);
- the producer brings a [256, 128] activation box and the same [128, 64] packed weight box per K step, 3 stages
  (56 KB each: 168 KB, and 32 KB of epilogue buffers);
- the converter (4 warps) is the shipped one, on the 256-row tiles' order;
- each math warpgroup owns 128 rows as two 64-row sub-tiles with an accumulator each: per K step one m64n128k128
  MMA per sub-tile that holds real rows, each waited for and promoted as in the shipped kernel (so every output
  element is the same MMA chain and promotion: bitwise equal to the shipped kernel on the same layout); sub-tiles
  of padding only are skipped.
The 256-aligned layout costs padding rows (not MMAs): up to 255 per expert instead of 127, which the dispatch
would allocate and the activation pass would skip.

Measures per layout (96 experts of 128-1,024 rows; 384 of 32-96, the engine's, for completeness) and GEMM (w13
4,608 x 5,120, w2 5,120 x 2,304), CUDA-graph replay, TFLOP/s on the real rows: the shipped call on the usual
128-aligned layout (the baseline) and on the 256-aligned one, the variant on the 256-aligned one (bitwise against
the shipped call there), `torch._scaled_grouped_mm` (FP8 rowwise) on the 128-aligned one. Writes
$OUT/exp_moe_contiguous_m256.json.

    cd benchmarks && python3 exp_moe_contiguous_m256.py
"""

from __future__ import annotations

import functools
import json
import os

import torch
from bench_deepgemm import FP4_SCALE_BOUND, rand_fp4_weight_scales, rand_fp8, rand_ue8m0  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, PREFILL_LAYOUTS, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import _ROW_WORDS, _convert_rows, _raw_words
from mini_deepgemm.gemm_gluon_fp8_kernel import _store_tile, _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

BLOCK_M = 256


@gluon.jit
def _loads(a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """The shipped producer (_contiguous_loads) over 256-row tiles."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 256) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 256, 128, GROUP_M)
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
def _convert(raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """The shipped converter (_contiguous_convert) over 256-row tiles."""
    STAGES: gl.constexpr = raw_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, STAGES)
    num_k = K // 128
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, _ROW_WORDS))
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 256) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 256, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)
            offsets, offsets_next = gl.load(row_offsets), gl.load(row_offsets + gl.minimum(1, num_k - 1))
            for k in range(num_k):
                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))
                slot = step % STAGES
                mbarrier.wait(raw_ready.index(slot), (step // STAGES) & 1)
                tile_words = _convert_rows(raw_words.index(slot).load(_ROW_WORDS), offsets)
                b_ring.index(slot).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                offsets, offsets_next = offsets_next, offsets_after
                step += 1


@gluon.jit
def _sub_tile_store(acc, d_desc, d_smem, d_ptr, layout_ptr, off_m, off_n, M, stride_d, MMA: gl.constexpr):
    """The shipped epilogue's store of 64 rows at off_m (acc already column-scaled): one TMA box when every row is
    used, else the used rows by masked pointer stores."""
    offs_m = off_m + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    cols = off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, MMA))
    row_groups = gl.load(layout_ptr + offs_m, mask=offs_m < M, other=-1)
    if gl.min(row_groups, axis=0) >= 0:
        _store_tile(acc, d_desc, d_smem, off_m, off_n)
    else:
        gl.store(d_ptr + offs_m.to(gl.int64)[:, None] * stride_d + cols[None, :], acc.to(gl.bfloat16),
                 mask=(row_groups >= 0)[:, None])


@gluon.jit
def _math(a_ring, b_ring, ready, empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
          stride_sa, stride_d, GROUP_M: gl.constexpr, ROW0: gl.constexpr):
    """Rows [ROW0, ROW0 + 128) of every 256-row tile as two 64-row sub-tiles (module docstring); a sub-tile whose
    first row is padding is all padding (segments are 256-aligned, padding last) and is skipped."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    num_k = K // 128
    zero = gl.zeros([64, 128], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 256) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 256, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            real0 = gl.load(layout_ptr + gl.minimum(off_m + ROW0, M - 1)) >= 0
            real1 = gl.load(layout_ptr + gl.minimum(off_m + ROW0 + 64, M - 1)) >= 0
            offs_m0 = off_m + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
            sa_rows0 = sa_ptr + gl.minimum(offs_m0, M - 1).to(gl.int64) * stride_sa
            sa_rows1 = sa_ptr + gl.minimum(offs_m0 + 64, M - 1).to(gl.int64) * stride_sa
            wa0, wa1 = gl.load(sa_rows0), gl.load(sa_rows1)
            acc0 = gl.zeros([64, 128], gl.float32, mma)
            acc1 = gl.zeros([64, 128], gl.float32, mma)
            for k in range(num_k):
                ahead = gl.minimum(k + 1, num_k - 1)
                wa0_next, wa1_next = gl.load(sa_rows0 + ahead), gl.load(sa_rows1 + ahead)
                slot = step % STAGES
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                b_tile = b_ring.index(slot).permute((1, 0))
                if real0:
                    part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                        a_ring.index(slot).slice(ROW0, 64, dim=0), b_tile, zero, use_acc=False, is_async=True),))
                    acc0 = acc0 + part * wa0[:, None]
                if real1:
                    part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                        a_ring.index(slot).slice(ROW0 + 64, 64, dim=0), b_tile, zero, use_acc=False,
                        is_async=True),))
                    acc1 = acc1 + part * wa1[:, None]
                mbarrier.arrive(empty.index(slot), count=1)
                wa0, wa1 = wa0_next, wa1_next
                step += 1
            colscale = gl.load(colscale_ptr + g * N + off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, mma)))
            if real0:
                _sub_tile_store(acc0 * colscale[None, :], d_desc, d_smem, d_ptr, layout_ptr, off_m + ROW0, off_n, M,
                                stride_d, mma)
            if real1:
                _sub_tile_store(acc1 * colscale[None, :], d_desc, d_smem, d_ptr, layout_ptr, off_m + ROW0 + 64,
                                off_n, M, stride_d, mma)
    tma.store_wait(pendings=0)


@gluon.jit
def variant_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K, stride_sa,
                   stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """fp4_e4m3_contiguous_kernel (SA_PER_128) on 256 x 128 tiles: a_desc in [256, 128] boxes, layout segments
    256-aligned; launch with num_warps=4 and maxnreg 128. Registers: each math warpgroup 216 (two accumulators and
    the MMA's part: 192; offline, triton 3.6, sm_90a: 200 spilled 64 instructions, 208 30, 216 none in the K loop,
    16 in the prologue and epilogue), the producer 24, the converter the 56 left (no spills)."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 256, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128],
                                      gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=2)  # the activation TMA's expect-tx and the converter's arrival
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one per math warpgroup
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    gl.warp_specialize(
        [(_convert, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M)),
         (_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr, colscale_ptr,
                  layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0)),
         (_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr, colscale_ptr,
                  layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 128)),
         (_loads, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K, GROUP_M))],
        [4, 4, 1], [216, 216, 24])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on variant_kernel's 256-row tiles."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    variant_kernel[(min(-(-m // BLOCK_M) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (BLOCK_M, 128)), w_desc, G._tma_desc(d, (64, 128)), d, folded.offsets, sa,
        folded.column_scales, layout, m, n, k, k // 128, d.stride(0), STAGES=3, GROUP_M=8, num_warps=4, maxnreg=128)


def aligned_layout(rows: list[int], align: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bench_deepgemm.moe_layout's (layout, ends) for given rows per expert, each segment padded to `align`."""
    padded = [-(-m // align) * align for m in rows]
    ids = torch.cat([torch.tensor([g] * m + [-1] * (p - m), dtype=torch.int32)
                     for g, (m, p) in enumerate(zip(rows, padded))])
    return ids.cuda(), torch.tensor(padded, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()


def operands(groups: int, rows_range: tuple[int, int], name: str, gen: torch.Generator):
    """Rows per expert uniform in rows_range and the GEMM's folded weights; per alignment (128, 256) the layout,
    its ends, the activations (raw and folded per 128) and an output."""
    N, K = {n: (N, K) for n, N, K in MOE_SHAPES}[name]
    rows = torch.randint(rows_range[0], rows_range[1] + 1, (groups,), generator=gen).tolist()
    bq = torch.randint(0, 256, (groups, N, K // 2), dtype=torch.uint8, device="cuda")
    sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
    sides = {}
    for align in (128, 256):
        layout, ends = aligned_layout(rows, align)
        M = layout.numel()
        a = (rand_fp8(M, K), rand_ue8m0(M, K // 32))
        sides[align] = (layout, ends, a, fold_ue8m0_to_128(*a, 1), torch.empty(M, N, dtype=torch.bfloat16,
                                                                                device="cuda"))
    return rows, bq, sb, G.fold_fp4_weight_scales(sb), sides


def shipped_call(a128, bq, sb, folded, d, layout):
    """The package's contiguous call (the engine's form: folded weights, activations folded per 128)."""
    return functools.partial(G.m_grouped_fp8_fp4_gemm_nt_contiguous, a128, (bq, sb), d, layout,
                             weight_scale_max=FP4_SCALE_BOUND, folded=folded)


def profile_call(variant: str):
    """profile_ncu.py's case exp_moe_contiguous_m256:profile_call:VARIANT, at 96 experts of 128-1,024 rows, w13
    (seed 0): "shipped" on the 128-aligned layout, "m256" on the 256-aligned one."""
    _, bq, sb, folded, sides = operands(96, (128, 1024), "w13", torch.Generator().manual_seed(0))
    if variant == "shipped":
        layout, _, _, a128, d = sides[128]
        return shipped_call(a128, bq, sb, folded, d, layout)
    layout, _, _, a128, d = sides[256]
    return functools.partial(launch, a128, bq, folded, d, layout)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    for groups, rows_range in PREFILL_LAYOUTS:
        for name, N, K in MOE_SHAPES:
            rows, bq, sb, folded, sides = operands(groups, rows_range, name, gen)
            flops = 2 * sum(rows) * N * K
            row = {"groups": groups, "rows_range": rows_range, "name": name, "N": N, "K": K, "rows": sum(rows),
                   "M_128": sides[128][0].numel(), "M_256": sides[256][0].numel()}
            calls = {}
            for align, (layout, _, _, a128, d) in sides.items():
                calls[f"shipped_{align}"] = (shipped_call(a128, bq, sb, folded, d, layout), d, layout)
            layout, _, _, a128, d = sides[256]
            out = torch.empty_like(d)
            calls["m256"] = (functools.partial(launch, a128, bq, folded, out, layout), out, layout)
            row["tflops_scaled_grouped_mm"] = flops / ms(scaled_grouped_mm_peer(sides[128][2][0], sides[128][1], groups,
                                                                                N, K)) / 1e9
            for key in ("shipped_128", "shipped_256", "m256"):
                call = calls[key][0]
                try:
                    call()
                    torch.cuda.synchronize()
                    row[f"tflops_{key}"] = flops / ms(call) / 1e9
                except Exception as e:  # noqa: BLE001 - the variant failing to build must not hide the baseline
                    row[f"error_{key}"] = repr(e)[:400]
                    row[f"tflops_{key}"] = float("nan")
            _, want, layout = calls["shipped_256"]
            used = layout >= 0
            differs = (calls["m256"][1][used].view(torch.int16) != want[used].view(torch.int16)).any(dim=1)
            row["differing_rows_m256"] = int(differs.sum())
            row["tflops_shipped_128_again"] = flops / ms(calls["shipped_128"][0]) / 1e9
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            calls.clear()
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_m256.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        base = r["tflops_shipped_128"]
        print(f"== {r['groups']} experts of {r['rows_range']} rows, {r['name']}: shipped {base:.0f} / "
              f"{r['tflops_shipped_128_again']:.0f} TFLOP/s (128-aligned, M {r['M_128']}), "
              f"{r['tflops_shipped_256']:.0f} (256-aligned, M {r['M_256']}); m256 {r['tflops_m256']:.0f} = "
              f"{r['tflops_m256'] / base:.3f}x shipped, {r['tflops_m256'] / r['tflops_scaled_grouped_mm']:.2f}x "
              f"scaled_grouped_mm ({r['tflops_scaled_grouped_mm']:.0f}); rows differing {r['differing_rows_m256']}")


if __name__ == "__main__":
    main()
