"""Experiment (issue 5, session 40): sparse attention over bf16 rows with Q in registers, a warpgroup of its own for
QK^T and the softmax, and a ring of three tiles.

Why (docs/reports/flashmla-gluon.md, "Session 40"): the shipped kernel keeps Q [64, 512] bf16 in shared memory
(64 KB), so only two 64-slot tiles fit beside it. In its seesaw a pair of blocks holds both tiles, and the tile
released last (block B's, after both PVs) is the first one warpgroup 1 needs in the next pair: its fill (~1.2 us at
the device's measured gather rate of 7.4 TB/s) is exposed once per pair, and warpgroup 1 waits on it for ~28% of its
time. Q as the QK^T wgmma's register operand (128 registers per thread of one warpgroup) frees the 64 KB for a third
tile, so the producer can fill a tile while two are in use.

How: four partitions of one warpgroup each (16 warps, one CTA per SM):
- the producer (default partition; bf16 rows by cp.async into tile blk % 3, as the shipped producer);
- the QK warpgroup: Q loaded once into the wgmma A-operand registers; per block S = Q K^T (m64n64k512, register A),
  the online-softmax step of the shipped kernel (same operations in the same order), P rounded to bf16 into one of two
  P buffers with its alpha, then `pub`; it releases the tile after its softmax (which reads the block's staged ids);
- two PV warpgroups, output columns 0-255 and 256-511: per block, wait for P, rescale the accumulator by alpha,
  acc += P V, release P and the tile; at the end they divide by the QK warpgroup's row sum (+ sink).
Registers (setmaxnreg, 512 per lane over the four): QK 200, PV 144 each, producer 24.
Numerics are the reference's online softmax over 64-slot blocks with P rounded to bf16; the row sum is one
warpgroup's (the shipped kernel adds two partial sums), so outputs match the shipped kernel within fp32 rounding.

Measured: the shipped call (mini_flashmla.sparse_mla_fwd) and this kernel on bench_flashmla's prefill case and on a
16,384-row pool, interleaved do_bench medians; relative L2 against the shipped kernel (all queries) and the
reference (first 256). Writes $OUT/exp_flashmla_qk_warpgroup.json.

    cd benchmarks && python3 exp_flashmla_qk_warpgroup.py
"""

from __future__ import annotations

import json
import os

import mini_flashmla
import torch
from bench_flashmla import CONTEXT, H, L2_POOL_ROWS, S_Q, SCALE, TOPK_C, W, bench, environment, prefill_case
from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring
from mini_flashmla import reference
from mini_flashmla.sparse_attn_gluon_kernel import (BF16_COPY, BLOCK_N, D, HALF, HEADS, IDS_SHARED, IDS_SLOTS, LN2,
                                                    LOG2E, NEG_INIT, PRODUCER_WARPS, S_WG, STATS_SHARED,
                                                    TILE_SHARED, _block_ids, _staged_rows)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

TILES3: gl.constexpr = gl.constexpr(3)
QK_REGS: gl.constexpr = gl.constexpr(200)
PV_REGS: gl.constexpr = gl.constexpr(144)
Q_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=S_WG, k_width=2)
Q_LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # [64, 512] bf16, 16 B per load
QUARTER: gl.constexpr = gl.constexpr(128)
O_Q: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])


@gluon.jit
def _producer3(tiles, ids_smem, full, empty, n_blocks, kv_ptr, ids_ptr, a_len, num_rows):
    """The shipped bf16-rows producer on a ring of TILES3 tiles."""
    ids_smem.index(0).store(_block_ids(0, n_blocks, ids_ptr, a_len, ids_ptr, 0))
    gl.thread_barrier()
    for blk in range(n_blocks):
        t = blk % TILES3
        next_ids = _block_ids(blk + 1, n_blocks, ids_ptr, a_len, ids_ptr, 0)
        rows = _staged_rows(ids_smem.index(blk % IDS_SLOTS), num_rows, gl.SliceLayout(1, BF16_COPY))
        cols = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
        mbarrier.wait(empty.index(t), ((blk // TILES3) & 1) ^ 1)
        async_copy.async_copy_global_to_shared(tiles.index(t), kv_ptr + rows[:, None] * D + cols[None, :])
        async_copy.mbarrier_arrive(full.index(t), increment_count=False)
        # slot (blk + 1) % 4 held block blk - 3's ids, read by the QK warpgroup before it released that block's tile
        ids_smem.index((blk + 1) % IDS_SLOTS).store(next_ids)
        mbarrier.arrive(full.index(t), count=1)


@gluon.jit
def _qk_softmax(q_ptr, stride_q_s, stride_q_h, tiles, ids_smem, p_smem, alpha_smem, stats_smem, full, empty, pub,
                pfree, done, n_blocks, num_rows, qk_scale_log2):
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_LOAD))
    dims = gl.arange(0, D, gl.SliceLayout(0, Q_LOAD))
    q = gl.convert_layout(gl.load(q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :]), Q_OP)
    m_run = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_WG))
    l_run = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_WG))
    s = gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_WG)
    for blk in range(n_blocks):
        t = blk % TILES3
        mbarrier.wait(full.index(t), (blk // TILES3) & 1)
        fence_async_shared()  # the tile's cp.async writes before the wgmma's reads
        s = warpgroup_mma(q, tiles.index(t).permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        ids = ids_smem.index(blk % IDS_SLOTS).load(gl.SliceLayout(0, S_WG))
        valid = (ids >= 0) & (ids < num_rows)
        sl = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_run, gl.max(sl, 1))
        alpha = gl.exp2(m_run - m_new)
        p = gl.exp2(sl - m_new[:, None])
        l_run = l_run * alpha + gl.sum(p, 1)
        m_run = m_new
        mbarrier.arrive(empty.index(t), count=1)  # after the ids' read
        ps = blk % 2
        mbarrier.wait(pfree.index(ps), ((blk // 2) & 1) ^ 1)
        p_smem.index(ps).store(p.to(gl.bfloat16))
        alpha_smem.index(ps).store(alpha)
        fence_async_shared()  # P's generic-proxy stores before the PV warpgroups' wgmma reads
        mbarrier.arrive(pub.index(ps), count=1)
    stats_smem.index(0).store(m_run)
    stats_smem.index(1).store(l_run)
    mbarrier.arrive(done, count=1)


@gluon.jit
def _pv_half(tiles, p_smem, alpha_smem, stats_smem, full, empty, pub, pfree, done, n_blocks, sink_ptr, out_ptr,
             stride_out_s, stride_out_h, lse_ptr, stride_lse_s, HAS_SINK: gl.constexpr, COL: gl.constexpr):
    # two [64, 128] accumulators: ptxas needs 154 registers for one m64n256 wgmma, and 16 warps launch at 128
    acc0 = gl.full([HEADS, QUARTER], 0.0, gl.float32, O_Q)
    acc1 = gl.full([HEADS, QUARTER], 0.0, gl.float32, O_Q)
    for blk in range(n_blocks):
        t = blk % TILES3
        ps = blk % 2
        mbarrier.wait(full.index(t), (blk // TILES3) & 1)
        mbarrier.wait(pub.index(ps), (blk // 2) & 1)
        fence_async_shared()
        alpha = alpha_smem.index(ps).load(gl.SliceLayout(1, O_Q))[:, None]
        v = tiles.index(t).slice(COL * HALF, HALF, dim=1)
        acc0 = warpgroup_mma(p_smem.index(ps), v.slice(0, QUARTER, dim=1), acc0 * alpha, is_async=True)
        acc1 = warpgroup_mma(p_smem.index(ps), v.slice(QUARTER, QUARTER, dim=1), acc1 * alpha, is_async=True)
        acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
        mbarrier.arrive(pfree.index(ps), count=1)
        mbarrier.arrive(empty.index(t), count=1)
    mbarrier.wait(done, 0)
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    m_run = stats_smem.index(0).load(gl.SliceLayout(1, O_Q))
    l_i = stats_smem.index(1).load(gl.SliceLayout(1, O_Q))
    rows = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, O_Q))
    denom = l_i
    if HAS_SINK:
        denom = denom + gl.exp2(gl.load(sink_ptr + rows) * LOG2E - m_run)
    if COL == 0:
        gl.store(lse_ptr + sq * stride_lse_s + rows, gl.where(l_i > 0, (m_run + gl.log2(l_i)) * LN2, float("-inf")))
    out = out_ptr + sq * stride_out_s + rows[:, None] * stride_out_h
    dims = COL * HALF + gl.arange(0, QUARTER, gl.SliceLayout(0, O_Q))[None, :]
    gl.store(out + dims, gl.where(denom[:, None] > 0, acc0 / denom[:, None], 0.0).to(gl.bfloat16))
    gl.store(out + QUARTER + dims, gl.where(denom[:, None] > 0, acc1 / denom[:, None], 0.0).to(gl.bfloat16))


@gluon.jit(do_not_specialize=["a_len", "a_rows"])
def qk_warpgroup_kernel(q_ptr, stride_q_s, stride_q_h, kv_ptr, ids_ptr, stride_ids, a_len, a_rows, sink_ptr, out_ptr,
                        stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK: gl.constexpr):
    """Grid (s_q, h // 64); bf16 rows only, unsplit. Outputs as sparse_mla_fwd_gluon_kernel's."""
    n_blocks = gl.cdiv(a_len, BLOCK_N)
    ids_ptr = ids_ptr + gl.program_id(0) * stride_ids
    tiles = gl.allocate_shared_memory(gl.bfloat16, [TILES3, BLOCK_N, D], TILE_SHARED)
    ids_smem = gl.allocate_shared_memory(gl.int32, [IDS_SLOTS, BLOCK_N], IDS_SHARED)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [2, HEADS, BLOCK_N], TILE_SHARED)
    alpha_smem = gl.allocate_shared_memory(gl.float32, [2, HEADS], STATS_SHARED)
    stats_smem = gl.allocate_shared_memory(gl.float32, [2, HEADS], STATS_SHARED)
    full = gl.allocate_shared_memory(gl.int64, [TILES3, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [TILES3, 1], mbarrier.MBarrierLayout())
    pub = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for t in gl.static_range(TILES3):
        mbarrier.init(full.index(t), count=PRODUCER_WARPS * 32 + 1)
        mbarrier.init(empty.index(t), count=3)
    for w in gl.static_range(2):
        mbarrier.init(pub.index(w), count=1)
        mbarrier.init(pfree.index(w), count=2)
    mbarrier.init(done, count=1)
    gl.warp_specialize(
        [(_producer3, (tiles, ids_smem, full, empty, n_blocks, kv_ptr, ids_ptr, a_len, a_rows)),
         (_qk_softmax, (q_ptr, stride_q_s, stride_q_h, tiles, ids_smem, p_smem, alpha_smem, stats_smem, full, empty,
                        pub, pfree, done, n_blocks, a_rows, qk_scale_log2)),
         (_pv_half, (tiles, p_smem, alpha_smem, stats_smem, full, empty, pub, pfree, done, n_blocks, sink_ptr,
                     out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s, HAS_SINK, 0)),
         (_pv_half, (tiles, p_smem, alpha_smem, stats_smem, full, empty, pub, pfree, done, n_blocks, sink_ptr,
                     out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s, HAS_SINK, 1))],
        [4, 4, 4], [QK_REGS, PV_REGS, PV_REGS])
    _invalidate_ring(full, empty)


def qk_warpgroup_attention(q, kv, idx, sm_scale, sink):
    """(out bf16 [s_q, h, 512], lse fp32 [s_q, h]) of bf16 rows through qk_warpgroup_kernel (h a multiple of 64)."""
    s_q, h, _ = q.shape
    idx = idx.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    sink_arg = sink if sink is not None else lse
    qk_warpgroup_kernel[(s_q, h // HEADS)](
        q, q.stride(0), q.stride(1), kv, idx, idx.stride(0), idx.shape[1], kv.shape[0], sink_arg, out, out.stride(0),
        out.stride(1), lse, lse.stride(0), sm_scale * LOG2E.value, HAS_SINK=sink is not None, num_warps=4,
        maxnreg=65536 // (16 * 32))
    return out, lse


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    dev = torch.device("cuda")
    flops = 2 * S_Q * H * (W + TOPK_C) * 2 * D.value
    c = prefill_case(dev)
    q, kv, idx, sink = c["q"], c["kv"], c["idx"], c["sink"]
    result = {"environment": environment(dev), "rows": []}
    for pool, ids in ((CONTEXT, idx), (L2_POOL_ROWS, torch.where(idx >= 0, idx % L2_POOL_ROWS, idx))):
        shipped = mini_flashmla.sparse_mla_fwd(q, kv, ids, SCALE, sink)
        new = qk_warpgroup_attention(q, kv, ids, SCALE, sink)
        ref_out, _ = reference.sparse_attn_ref(q[:256], kv, ids[:256], SCALE, sink)
        row = {"pool_rows": pool, "rel_l2_vs_shipped": rel_l2(new[0], shipped[0]),
               "lse_max_abs_vs_shipped": (new[1] - shipped[1]).abs().max().item(),
               "rel_l2_vs_reference_first256": rel_l2(new[0][:256], ref_out),
               "shipped_rel_l2_vs_reference_first256": rel_l2(shipped[0][:256], ref_out)}
        times = {"shipped": [], "qk_warpgroup": []}
        for _ in range(3):
            times["shipped"].append(bench(lambda ids=ids: mini_flashmla.sparse_mla_fwd(q, kv, ids, SCALE, sink)))
            times["qk_warpgroup"].append(bench(lambda ids=ids: qk_warpgroup_attention(q, kv, ids, SCALE, sink)))
        for name, ts in times.items():
            row[f"{name}_ms"] = sorted(ts)[1]
            row[f"{name}_tflops"] = flops / row[f"{name}_ms"] / 1e9
        row["ratio"] = row["qk_warpgroup_tflops"] / row["shipped_tflops"]
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_qk_warpgroup.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| pool rows | shipped TFLOP/s | Q-in-registers, 3 tiles | ratio | rel. L2 vs shipped | vs reference |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['pool_rows']:,} | {r['shipped_tflops']:.1f} | {r['qk_warpgroup_tflops']:.1f} | {r['ratio']:.3f} "
              f"| {r['rel_l2_vs_shipped']:.1e} | {r['rel_l2_vs_reference_first256']:.1e} |")


if __name__ == "__main__":
    main()
