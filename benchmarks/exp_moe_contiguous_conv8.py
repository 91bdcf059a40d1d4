"""Experiment (issue 4, session 27): the contiguous (prefill) FP8 x FP4 MoE kernel with 8 converter warps.

Why: session 21's Nsight Compute profile of the shipped kernel (`data/s21-run3/ncu/moe_w13_fold128_sass.csv.gz`),
attributed per partition in session 27 (docs/reports/deepgemm-moe-fold-128.md, "Session 27"): the converter's 4
warps (one per scheduler) wait for packed weights in only 3% of their samples; they issue ~237 instructions per K
step at ~0.2 instructions per cycle (stalls: fixed-latency dependencies 20%, other warps selected 14%, shared and
global loads 17%), so a step of the converter takes about as long as a step of the whole kernel (~1,100-1,350
cycles). The math warpgroups meanwhile wait on "ready" or on their MMAs, the loader on free slots (80%). Without the
conversion the kernel runs 1.37x faster (session 23's breakdown). The converter is latency-bound at one warp per
scheduler.

How: the shipped kernel (its loader, math warpgroups, ring and epilogue from the package) with two 4-warp converter
partitions, each converting 64 of the step's 128 weight rows (a thread half a row, 8 words) and arriving on "ready"
(count 3: the activation TMA and both converters). Each scheduler then interleaves two converter warps. Registers:
ptxas needs at least 90 at launch for the MMA's instructions, so 17 warps (20 with Gluon's padding) launch at 96,
the default converter keeps them, the second converter and the loader give theirs up, and the math warpgroups take
160-168 (the shipped kernel gives them 200: its epilogue spilled at 192).
Every output element is the same MMA and promotion, so rows must be bitwise equal to the shipped kernel's.

Measures (96 experts, 128-1,024 rows each, w13 4,608 x 5,120 and w2 5,120 x 2,304, folded weights and activations,
CUDA-graph replay): TFLOP/s of the shipped kernel, each register split and `torch._scaled_grouped_mm` (FP8
rowwise, the issue's peer), bitwise comparison. Writes $OUT/exp_moe_contiguous_conv8.json.

    cd benchmarks && python3 exp_moe_contiguous_conv8.py
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
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import (_E2M1_TO_E4M3_PTX, LUT_HI_BASE, LUT_HI_STEP, LUT_LO_BASE,
                                                      LUT_LO_STEP, _contiguous_loads, _contiguous_math, _raw_words)
from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

# a converter partition's 64 rows of a step, int32 words [64, 16]: a thread converts half a row (8 words)
_HALF_ROW_WORDS = gl.constexpr(gl.BlockedLayout([1, 8], [32, 1], [2, 2], [1, 0]))
# (launch registers = the first converter's, the second converter's, the math warpgroups'): ptxas needs at least 90
# at launch for the MMA's instructions
REGISTER_SPLITS = ((96, 72, 160), (96, 64, 168))


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
def contiguous_conv8_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N, K,
                            stride_sa, stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                            CONVERT_REGS: gl.constexpr, MATH_REGS: gl.constexpr):
    """fp4_e4m3_contiguous_kernel with SA_PER_128 and two 4-warp converter partitions (the default one and a
    worker, 64 rows each); launch with num_warps=4."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=3)  # the TMA's expect-tx, both converters
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    gl.warp_specialize(
        [(_convert_half, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M, 0)),
         (_convert_half, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M, 1)),
         (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr, colscale_ptr,
                             layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0, True)),
         (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr, colscale_ptr,
                             layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64, True)),
         (_contiguous_loads, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N, K,
                              GROUP_M))],
        [4, 4, 4, 1], [CONVERT_REGS, MATH_REGS, MATH_REGS, 24])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor, regs: tuple[int, int, int]) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on contiguous_conv8_kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    contiguous_conv8_kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), w_desc, G._tma_desc(d, (64, 128)), d, folded.offsets, sa, folded.column_scales,
        layout, m, n, k, k // 128, d.stride(0), STAGES=4, GROUP_M=8, CONVERT_REGS=regs[1], MATH_REGS=regs[2],
        num_warps=4, maxnreg=regs[0])


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "register_splits": REGISTER_SPLITS, "rows": []}
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
        for regs in REGISTER_SPLITS:
            out = torch.empty_like(d)
            call = lambda: launch(a128, bq, folded, out, layout, regs)  # noqa: E731
            call()
            key = "conv8_" + "_".join(map(str, regs))
            row[f"tflops_{key}"] = flops / ms(call) / 1e9
            row[f"bitwise_{key}"] = bool(torch.equal(out[used].view(torch.int16), d[used].view(torch.int16)))
            row[f"max_abs_diff_{key}"] = (out[used].float() - d[used].float()).abs().max().item()
        row["tflops_shipped_again"] = flops / ms(shipped) / 1e9
        w8 = (torch.randn(96, N, K, device="cuda") * 4).to(torch.float8_e4m3fn)
        s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(96, N, device="cuda") + 0.5
        row["tflops_scaled_grouped_mm"] = flops / ms(lambda: torch._scaled_grouped_mm(
            a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)) / 1e9
        w8 = None  # frees it before the next shape (a rebinding: the timed lambda has run)
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_conv8.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        print(f"== {r['name']} ({r['rows']} rows): shipped {r['tflops_shipped']:.0f} / {r['tflops_shipped_again']:.0f} "
              f"TFLOP/s, scaled_grouped_mm {r['tflops_scaled_grouped_mm']:.0f}")
        for regs in REGISTER_SPLITS:
            key = "conv8_" + "_".join(map(str, regs))
            print(f"   8 converter warps, registers {regs}: {r[f'tflops_{key}']:.0f} TFLOP/s, "
                  f"{r[f'tflops_{key}'] / r['tflops_shipped']:.3f}x shipped, "
                  f"{r[f'tflops_{key}'] / r['tflops_scaled_grouped_mm']:.2f}x peer, bitwise {r[f'bitwise_{key}']}")


if __name__ == "__main__":
    main()
