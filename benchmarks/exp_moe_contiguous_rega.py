"""Experiment (issue 4; written in session 26 after its last GPU run, compiled offline, not yet GPU-run): the
contiguous (prefill) FP8 x FP4 MoE kernel swap-AB, each math warpgroup converting its own 64 weight rows straight
into its MMA's A registers, as the masked kernel has done since session 26 (docs/reports/deepgemm-moe-fold-128.md,
"Session 26").

Why (same report, session 23's breakdown): in the shipped contiguous kernel a converter partition writes each K
step's e4m3 weight tile to shared memory, fences and arrives; the two math warpgroups wait for it, then run
m64n128k128 MMAs with the weights as the B operand. The parts add up instead of overlapping (w13: full 3,707 us,
without the conversion 2,701, without the MMAs 2,388). The route sits at 0.82 / 0.94x `torch._scaled_grouped_mm`
(w13 / w2), the issue's target is 1.0x. The masked kernel's register-A path (no converted tile, fence or
cross-partition handoff between the conversion and its MMA) was 1.00-1.08x there.

How (everything but the math partition is the shipped kernel's: persistent tiles of 128 tokens x 128 weight rows in
GROUP_M order, the loader warp `_contiguous_loads`, its TMA ring of activation tiles and packed weight rows):
- Two math warpgroups, warpgroup w owning weight rows 64w .. 64w + 63 of the tile, no converter partition.
- Per K step: `_fragment_words` + `_register_operand` (the package's masked path) turn the warpgroup's half of the
  packed weights into the e4m3 A operand [64 weight rows, 128 of K] in registers; one m64n128k128 MMA takes the
  slot's activation tile [128 tokens, 128 of K] as B from shared memory; then acc += part * sa[token, k] (the
  activations folded per 128).
- Ping-pong, not pipelined within a warpgroup: a warpgroup converts, runs its MMA, waits and promotes, and the
  other warpgroup's conversion and promotion run under that MMA (FlashAttention-3's schedule). A warpgroup's per-step
  work is ~120 conversion and ~70 promotion instructions per thread against ~250 cycles of its m64n128k128 MMA.
  Converting step k + 1 under step k's MMA in the same warpgroup spilled 752 bytes offline (a second A operand, and
  triton 3.6 takes no 8-bit tensor as an MMA wait's dependency to keep the first one's registers).
- Epilogue: acc is [64 weight rows, 128 tokens]; times the rows' column scales; stored transposed, through shared
  memory and one TMA box [128 tokens, 64 columns] when all 128 tokens are real rows, else by masked pointer stores.
- Registers: 12 warps launch at 168; each math warpgroup takes 240 (setmaxnreg), the loader (the default
  partition, 4 warps of which one thread issues the copies) keeps the rest.
- Swap-AB puts the tokens on the MMA's N side, so a thread holds 32 tokens' activation scales (2 rows' in the
  shipped kernel). Their loads take a compile-time row stride (NUM_K) and no clamp, so they are one base plus
  immediate offsets; only a tile past the last row masks them (`_rega_steps`' TAIL copy).
- Offline (triton 3.6, sm_90a, NUM_K 40 and 18):
  - shared memory 131 KB with 4 stages, 181 KB with 6;
  - no spills in either K loop. 272 bytes of stack hold tile-level values, stored in the prologue and read in the
    masked-store epilogue;
  - the fast K loop is 294 SASS instructions per thread and step: 32 scale loads, 64 FFMAs of promotion, 16 16-bit
    shared loads, the conversion and 4 QGMMA.64x128x32.
  - So a scheduler issues ~590 instructions per pair of warpgroup steps against ~490 cycles of MMA. The kernel
    will be issue-bound before it is tensor-bound. The ceiling is near 1,600 TFLOP/s at full issue; the shipped
    kernel runs ~650.
Numerics: per output element the same 128-deep e4m3 MMA sums and the same promotion, in the same order, as the
shipped kernel, whose rows the masked kernel already matches bitwise; the run checks every used row bitwise.

Measures (96 experts, 128-1,024 rows each, w13 4,608 x 5,120 and w2 5,120 x 2,304, folded weights and activations,
CUDA-graph replay): TFLOP/s of the shipped kernel, this one and `torch._scaled_grouped_mm` (FP8 rowwise, the
issue's peer), and the bitwise comparison. Writes $OUT/exp_moe_contiguous_rega.json.

    cd benchmarks && python3 exp_moe_contiguous_rega.py
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
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import (_HALF_WORDS, _contiguous_loads, _fragment_words,
                                                      _register_operand)
from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

# 12 warps launch at 168 (64K per SM); the math warpgroups take 240 each, the loader's warpgroup keeps the rest (32)
MATH_REGS, LAUNCH_REGS = 240, 168


@gluon.jit
def _rega_steps(a_ring, raw_ring, ready, raw_ready, empty, row_offsets, sa_tile, rows_left, step, mma: gl.constexpr,
                NUM_K: gl.constexpr, HALF: gl.constexpr, TAIL: gl.constexpr):
    """One tile's K loop for weight rows [64 HALF, 64 HALF + 64) (module docstring) -> (acc fp32 [64 weight rows,
    128 tokens], ring step). sa_tile: the tile's first row of the activation scales (fp32, row stride NUM_K). With
    the stride a compile-time constant each thread's 32 scale loads are one base plus immediate offsets; a clamped
    or masked token index is not, and its 32 offsets spilled (offline: 344 / 160 bytes of stack), so only a TAIL
    tile (past the last row, M - off_m < 128 rows left) masks its loads."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    zero = gl.zeros([64, 128], gl.float32, mma)
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    acc = gl.zeros([64, 128], gl.float32, mma)
    for k in range(NUM_K):
        # the step's activation scales first: their latency runs under the conversion and the MMA (loaded after the
        # MMA's issue, half of them landed after its wait, in registers the A operand had held)
        if TAIL:
            wa = gl.load(sa_tile + k + cols * NUM_K, mask=cols < rows_left, other=0.0)
        else:
            wa = gl.load(sa_tile + k + cols * NUM_K)
        slot = step % STAGES
        phase = (step // STAGES) & 1
        mbarrier.wait(raw_ready.index(slot), phase)
        a_reg = _register_operand(_fragment_words(raw_ring, slot, HALF), gl.load(row_offsets + k), a_op)
        mbarrier.wait(ready.index(slot), phase)
        token = warpgroup_mma(a_reg, a_ring.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(0, deps=(token,))
        mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup's reads of the slot are done
        acc = acc + part * wa[None, :]
        step += 1
    return acc, step


@gluon.jit
def _rega_math(a_ring, raw_ring, ready, raw_ready, empty, d_desc, d_smem, d_ptr, offsets_ptr, sa_ptr, colscale_ptr,
               layout_ptr, M, N, stride_d, NUM_K: gl.constexpr, GROUP_M: gl.constexpr, HALF: gl.constexpr):
    """Weight rows [64 HALF, 64 HALF + 64) of every tile, all 128 tokens (module docstring)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    half_rows = gl.arange(0, 64, layout=gl.SliceLayout(1, _HALF_WORDS))
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, 128) * gl.cdiv(N, 128), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
        g = gl.load(layout_ptr + off_m)
        if g >= 0:
            row_offsets = offsets_ptr + (g * N + off_n + 64 * HALF + half_rows).to(gl.int64) * NUM_K
            sa_tile = sa_ptr + off_m.to(gl.int64) * NUM_K
            rows_left = M - off_m
            if rows_left >= 128:
                acc, step = _rega_steps(a_ring, raw_ring, ready, raw_ready, empty, row_offsets, sa_tile, rows_left,
                                        step, mma, NUM_K, HALF, False)
            else:
                acc, step = _rega_steps(a_ring, raw_ring, ready, raw_ready, empty, row_offsets, sa_tile, rows_left,
                                        step, mma, NUM_K, HALF, True)
            rows = off_n + 64 * HALF + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
            acc = acc * gl.load(colscale_ptr + g * N + rows)[:, None]
            cols = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
            token_groups = gl.load(layout_ptr + off_m + cols, mask=cols < rows_left, other=-1)
            if gl.min(token_groups, axis=0) >= 0:
                tma.store_wait(pendings=0)  # the previous tile's store has read d_smem
                d_smem.store(gl.permute(acc, (1, 0)).to(d_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(d_desc, [off_m, off_n + 64 * HALF], d_smem)
            else:  # one 64-bit base and 32-bit offsets: a thread holds 32 of the tile's tokens
                d_tile = d_ptr + off_m.to(gl.int64) * stride_d
                gl.store(d_tile + cols[None, :] * stride_d + rows[:, None], acc.to(gl.bfloat16),
                         mask=(token_groups >= 0)[None, :])
    tma.store_wait(pendings=0)


@gluon.jit
def contiguous_rega_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, layout_ptr, M, N,
                           stride_d, NUM_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                           MATH_REGS: gl.constexpr):
    """fp4_e4m3_contiguous_kernel's contract with SA_PER_128 (sa fp32 [M, NUM_K], contiguous; K = 128 NUM_K); d_desc
    in [128, 64] boxes. Persistent, at most one program per SM; num_warps=4 (the loader), maxnreg LAUNCH_REGS."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)  # the activation TMA's expect-tx (no converter arrives here)
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one per math warpgroup
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 128, 64], d_desc.layout)
    # the loader is the default partition, which keeps the launch's register limit: both math warpgroups are workers
    # and take MATH_REGS (a first version with math warpgroup 0 as the default partition, 9 warps launched at 224,
    # spilled 776 bytes offline; it also held 64-bit scale pointers, so that figure is not this code's)
    gl.warp_specialize(
        [(_contiguous_loads, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, layout_ptr, M, N,
                              128 * NUM_K, GROUP_M)),
         (_rega_math, (a_ring, raw_ring, ready, raw_ready, empty, d_desc, d_smem.index(0), d_ptr, offsets_ptr, sa_ptr,
                       colscale_ptr, layout_ptr, M, N, stride_d, NUM_K, GROUP_M, 0)),
         (_rega_math, (a_ring, raw_ring, ready, raw_ready, empty, d_desc, d_smem.index(1), d_ptr, offsets_ptr, sa_ptr,
                       colscale_ptr, layout_ptr, M, N, stride_d, NUM_K, GROUP_M, 1))],
        [4, 4], [MATH_REGS, MATH_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales, d: torch.Tensor,
           layout: torch.Tensor, stages: int = 4) -> None:
    """The shipped contiguous launch (gemm._fp4_e4m3_gemm) on contiguous_rega_kernel."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    assert sa.dtype == torch.float32 and sa.stride() == (k // 128, 1), "sa: fp32 [M, K / 128], contiguous"
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    contiguous_rega_kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), w_desc, G._tma_desc(d, (128, 64)), d, folded.offsets, sa,
        folded.column_scales, layout, m, n, d.stride(0), NUM_K=k // 128, STAGES=stages, GROUP_M=8,
        MATH_REGS=MATH_REGS, num_warps=4, maxnreg=LAUNCH_REGS)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    for name, N, K in MOE_SHAPES:
        rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(96, N, K, gen)
        sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
        folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
        d_rega, d_rega6 = torch.empty_like(d), torch.empty_like(d)
        calls = {
            "shipped": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a128, (bq, sb), d, layout,
                                                                      weight_scale_max=FP4_SCALE_BOUND, folded=folded),
            "register_a": lambda: launch(a128, bq, folded, d_rega, layout),
            "register_a_6_stages": lambda: launch(a128, bq, folded, d_rega6, layout, stages=6),
        }
        flops = 2 * sum(rows) * N * K
        row = {"name": name, "N": N, "K": K, "rows": sum(rows)}
        for kernel, call in calls.items():
            call()
            row[f"tflops_{kernel}"] = flops / ms(call) / 1e9
        w8 = (torch.randn(96, N, K, device="cuda") * 4).to(torch.float8_e4m3fn)
        s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(96, N, device="cuda") + 0.5
        row["tflops_scaled_grouped_mm"] = flops / ms(lambda: torch._scaled_grouped_mm(
            a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)) / 1e9
        w8 = None  # frees it before the next shape (a rebinding: the timed lambda has run)
        used = layout >= 0
        for kernel, out in (("register_a", d_rega), ("register_a_6_stages", d_rega6)):
            row[f"bitwise_{kernel}"] = bool(torch.equal(out[used].view(torch.int16), d[used].view(torch.int16)))
            row[f"max_abs_diff_{kernel}"] = (out[used].float() - d[used].float()).abs().max().item()
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_rega.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| GEMM | rows | shipped | register A, 4 / 6 stages | ratio | scaled_grouped_mm | register A / peer | "
          "bitwise |")
    for r in result["rows"]:
        best = max(r["tflops_register_a"], r["tflops_register_a_6_stages"])
        print(f"| {r['name']} | {r['rows']} | {r['tflops_shipped']:.0f} TFLOP/s | {r['tflops_register_a']:.0f} / "
              f"{r['tflops_register_a_6_stages']:.0f} | {best / r['tflops_shipped']:.2f}x | "
              f"{r['tflops_scaled_grouped_mm']:.0f} | {best / r['tflops_scaled_grouped_mm']:.2f}x | "
              f"{r['bitwise_register_a']} / {r['bitwise_register_a_6_stages']} |")

if __name__ == "__main__":
    main()
