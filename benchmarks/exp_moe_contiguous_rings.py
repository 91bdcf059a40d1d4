"""Experiment (issue 4, session 27): the contiguous (prefill) FP8 x FP4 MoE kernel with its three rings decoupled.

Why (docs/reports/deepgemm-moe-fold-128.md, sessions 21-23): in fp4_e4m3_contiguous_kernel one ring slot carries a
step's activation tile, its packed weights and their converted e4m3 tile, and is freed only when both math
warpgroups have run that step's MMA. So the packed weights hold their slot through the conversion and the MMA, and
the producer can have at most STAGES minus the slots held there in flight. Session 23's breakdown: w13 takes 3,707 us,
its copies and handshakes alone 1,846 (L2 -> shared at ~8 TB/s: the copies alone are half the kernel), without the
conversion 2,701, without the MMAs 2,388: the parts add up instead of overlapping, and the profiles (sessions 21-22)
put 51-54% of the working warps' stalls on the handshakes' mbarrier waits (barrier, long scoreboard). The route runs
0.82 / 0.92x `torch._scaled_grouped_mm` (w13 / w2); the issue's target is 1.0x.

How: the shipped partitions' work, on three rings with their own depths and barriers:
- activation tiles [128, 128] e4m3, A_STAGES deep: loaded by their own loader warp, freed by the math warpgroups;
- packed weights [128 rows, 64 bytes], RAW_STAGES deep: loaded by a second loader warp, freed by the converter as
  soon as it has read them into registers (before it converts), so weight loads run ahead of the MMAs;
- converted e4m3 tiles [128, 128], B_STAGES deep: written by the converter (which converts into registers first,
  then waits for a free tile), freed by the math warpgroups.
Everything else is the shipped kernel's (tiles, GROUP_M order, the conversion, one 128-deep MMA and one FMA per
element per K step, the epilogue), so every used row must be bitwise equal to the shipped kernel's.
Shared memory: 16 KB per activation stage, 8 KB per packed stage, 16 KB per converted stage, 32 KB of store buffers:
(4, 4, 4) is the shipped kernel's 192 KB, redistributed; (4, 8, 2), (5, 6, 2) and (6, 4, 2) are 192 KB too; (4, 8, 3),
(5, 8, 2) and (6, 6, 2) take 208 KB.

Measures (96 experts, 128-1,024 rows each, w13 4,608 x 5,120 and w2 5,120 x 2,304, folded weights and activations,
CUDA-graph replay): TFLOP/s of the shipped kernel, each ring configuration and `torch._scaled_grouped_mm` (FP8
rowwise, the issue's peer), and the bitwise comparison. Writes $OUT/exp_moe_contiguous_rings.json.

    cd benchmarks && python3 exp_moe_contiguous_rings.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import _convert_rows, _raw_words, _ROW_WORDS
from mini_deepgemm.gemm_gluon_fp8_kernel import _store_tile, _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

# (activation, packed weight, converted weight) stages
RING_CONFIGS = ((4, 4, 4), (4, 8, 2), (5, 6, 2), (6, 4, 2), (4, 8, 3), (5, 8, 2), (6, 6, 2))


@gluon.jit
def _ring_loads(desc, ring, ready, empty, layout_ptr, M, N, K, GROUP_M: gl.constexpr, WEIGHTS: gl.constexpr):
    """A loader warp: per step of the program's tiles, once its slot is free, the activation tile [off_m, 128 k]
    (WEIGHTS false) or the packed weight rows [g N + off_n, 64 k] (WEIGHTS true) into the ring by TMA."""
    STAGES: gl.constexpr = ring.type.shape[0]
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            for k in range(K // 128):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
                if WEIGHTS:
                    tma.async_copy_global_to_shared(desc, [g * N + off_n, k * 64], ready.index(slot), ring.index(slot))
                else:
                    tma.async_copy_global_to_shared(desc, [off_m, k * 128], ready.index(slot), ring.index(slot))
                step += 1


@gluon.jit
def _rings_convert(raw_ring, raw_ready, raw_empty, b_ring, b_ready, b_empty, offsets_ptr, layout_ptr, M, N, K,
                   GROUP_M: gl.constexpr):
    """The converter (default partition, 4 warps, a weight row per thread): read the packed slot and free it,
    convert in registers, then wait for a free converted tile, store it, fence and arrive."""
    RAW_STAGES: gl.constexpr = raw_ring.type.shape[0]
    B_STAGES: gl.constexpr = b_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, RAW_STAGES)
    num_k = K // 128
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, _ROW_WORDS))
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)
            offsets, offsets_next = gl.load(row_offsets), gl.load(row_offsets + gl.minimum(1, num_k - 1))
            for k in range(num_k):
                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))
                r = step % RAW_STAGES
                mbarrier.wait(raw_ready.index(r), (step // RAW_STAGES) & 1)
                words = raw_words.index(r).load(_ROW_WORDS)
                mbarrier.arrive(raw_empty.index(r), count=1)
                tile_words = _convert_rows(words, offsets)
                b = step % B_STAGES
                mbarrier.wait(b_empty.index(b), ((step // B_STAGES) & 1) ^ 1)
                b_ring.index(b).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(b_ready.index(b), count=1)
                offsets, offsets_next = offsets_next, offsets_after
                step += 1


@gluon.jit
def _rings_math(a_ring, a_ready, a_empty, b_ring, b_ready, b_empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr,
                layout_ptr, M, N, K, stride_d, GROUP_M: gl.constexpr, ROW0: gl.constexpr):
    """_contiguous_math's folded (SA_PER_128) path, the activation and converted tiles taken from their own rings."""
    A_STAGES: gl.constexpr = a_ring.type.shape[0]
    B_STAGES: gl.constexpr = b_ring.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    num_k = K // 128
    zero = gl.zeros([64, 128], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            offs_m = off_m + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
            sa_rows = sa_ptr + gl.minimum(offs_m, M - 1).to(gl.int64) * num_k
            wa = gl.load(sa_rows)
            acc = gl.zeros([64, 128], gl.float32, mma)
            for k in range(num_k):
                wa_next = gl.load(sa_rows + gl.minimum(k + 1, num_k - 1))
                a = step % A_STAGES
                b = step % B_STAGES
                mbarrier.wait(a_ready.index(a), (step // A_STAGES) & 1)
                mbarrier.wait(b_ready.index(b), (step // B_STAGES) & 1)
                part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                    a_ring.index(a).slice(ROW0, 64, dim=0), b_ring.index(b).permute((1, 0)), zero, use_acc=False,
                    is_async=True),))
                mbarrier.arrive(a_empty.index(a), count=1)
                mbarrier.arrive(b_empty.index(b), count=1)
                acc = acc + part * wa[:, None]
                wa = wa_next
                step += 1
            cols = off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
            acc = acc * gl.load(colscale_ptr + g * N + cols)[None, :]
            row_groups = gl.load(layout_ptr + offs_m, mask=offs_m < M, other=-1)
            if gl.min(row_groups, axis=0) >= 0:
                _store_tile(acc, d_desc, d_smem, off_m + ROW0, off_n)
            else:
                gl.store(d_ptr + offs_m.to(gl.int64)[:, None] * stride_d + cols[None, :], acc.to(gl.bfloat16),
                         mask=(row_groups >= 0)[:, None])
    tma.store_wait(pendings=0)


@gluon.jit
def _barriers(STAGES: gl.constexpr, READY: gl.constexpr, EMPTY: gl.constexpr):
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=READY)
        mbarrier.init(empty.index(s), count=EMPTY)
    return ready, empty


@gluon.jit
def _invalidate(ready, empty):
    STAGES: gl.constexpr = ready.type.shape[0]
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@gluon.jit
def contiguous_rings_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
                            stride_d, A_STAGES: gl.constexpr, RAW_STAGES: gl.constexpr, B_STAGES: gl.constexpr,
                            GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """fp4_e4m3_contiguous_kernel's contract with SA_PER_128 (sa fp32 [M, K / 128], contiguous), on three rings
    (module docstring). num_warps=4 (the converter), maxnreg 128."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [A_STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [RAW_STAGES, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [B_STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [B_STAGES, 128, 128], a_desc.layout)
    a_ready, a_empty = _barriers(A_STAGES, 1, 2)
    raw_ready, raw_empty = _barriers(RAW_STAGES, 1, 1)
    b_ready, b_empty = _barriers(B_STAGES, 1, 2)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    gl.warp_specialize(
        [(_rings_convert, (raw_ring, raw_ready, raw_empty, b_ring, b_ready, b_empty, offsets_ptr, layout_ptr, M, N,
                           K, GROUP_M)),
         (_rings_math, (a_ring, a_ready, a_empty, b_ring_e4m3, b_ready, b_empty, d_desc, d_smem.index(0), d_ptr,
                        sa_ptr, colscale_ptr, layout_ptr, M, N, K, stride_d, GROUP_M, 0)),
         (_rings_math, (a_ring, a_ready, a_empty, b_ring_e4m3, b_ready, b_empty, d_desc, d_smem.index(1), d_ptr,
                        sa_ptr, colscale_ptr, layout_ptr, M, N, K, stride_d, GROUP_M, 64)),
         (_ring_loads, (a_desc, a_ring, a_ready, a_empty, layout_ptr, M, N, K, GROUP_M, False)),
         (_ring_loads, (w_desc, raw_ring, raw_ready, raw_empty, layout_ptr, M, N, K, GROUP_M, True))],
        [4, 4, 1, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    _invalidate(a_ready, a_empty)
    _invalidate(raw_ready, raw_empty)
    _invalidate(b_ready, b_empty)


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor, stages: tuple[int, int, int]) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on contiguous_rings_kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    assert sa.dtype == torch.float32 and sa.stride() == (k // 128, 1), "sa: fp32 [M, K / 128], contiguous"
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    contiguous_rings_kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), w_desc, G._tma_desc(d, (64, 128)), d, folded.offsets, sa, folded.column_scales,
        layout, m, n, k, d.stride(0), A_STAGES=stages[0], RAW_STAGES=stages[1], B_STAGES=stages[2], GROUP_M=8,
        CONSUMER_REGS=200, PRODUCER_REGS=24, num_warps=4, maxnreg=128)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "configs": RING_CONFIGS, "rows": []}
    for name, N, K in MOE_SHAPES:
        rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(96, N, K, gen)
        sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
        folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
        flops = 2 * sum(rows) * N * K
        row = {"name": name, "N": N, "K": K, "rows": sum(rows)}
        shipped = lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(  # noqa: E731
            a128, (bq, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded)
        shipped()
        row["tflops_shipped"] = flops / ms(shipped) / 1e9
        used = layout >= 0
        for stages in RING_CONFIGS:
            out = torch.empty_like(d)
            call = lambda: launch(a128, bq, folded, out, layout, stages)  # noqa: E731
            call()
            key = "rings_" + "_".join(map(str, stages))
            row[f"tflops_{key}"] = flops / ms(call) / 1e9
            row[f"bitwise_{key}"] = bool(torch.equal(out[used].view(torch.int16), d[used].view(torch.int16)))
        row["tflops_shipped_again"] = flops / ms(shipped) / 1e9  # drift check: the shipped kernel last as well
        w8 = (torch.randn(96, N, K, device="cuda") * 4).to(torch.float8_e4m3fn)
        s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(96, N, device="cuda") + 0.5
        row["tflops_scaled_grouped_mm"] = flops / ms(lambda: torch._scaled_grouped_mm(
            a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)) / 1e9
        w8 = None  # frees it before the next shape (a rebinding: the timed lambda has run)
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_rings.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        print(f"== {r['name']} ({r['rows']} rows): shipped {r['tflops_shipped']:.0f} / {r['tflops_shipped_again']:.0f} "
              f"TFLOP/s, scaled_grouped_mm {r['tflops_scaled_grouped_mm']:.0f}")
        for stages in RING_CONFIGS:
            key = "rings_" + "_".join(map(str, stages))
            print(f"   rings {stages}: {r[f'tflops_{key}']:.0f} TFLOP/s, {r[f'tflops_{key}'] / r['tflops_shipped']:.3f}x "
                  f"shipped, {r[f'tflops_{key}'] / r['tflops_scaled_grouped_mm']:.2f}x peer, bitwise "
                  f"{r[f'bitwise_{key}']}")


if __name__ == "__main__":
    main()
