"""Experiment (issue 5; written in session 23 after its last GPU run, compiled offline, not yet run on a GPU): the
sparse-attention consumers out of lockstep, FlashMLA-style.

Why (docs/reports/flashmla-gluon.md, session 23): with bf16 rows the shipped kernel is consumer-bound at ~3.3 us per
64-slot block against ~1.2 us of tensor-core work. Its two consumer warpgroups split every block's QK^T by slots
(m64n32 each, Q read from shared memory twice per block), reduce the row max across each other and exchange P, so
both run QK^T, softmax and PV at the same time: the tensor pipe idles during every softmax (35% busy, run 2's
profile), and fewer barriers did not help (P through shared memory, 0.97x).

How: the shipped producer, unchanged (imported), and two consumer partitions of one warpgroup each that take turns:
- warpgroup 0 owns the even blocks, warpgroup 1 the odd ones. The owner runs the whole QK^T (m64n64k512: Q read once
  per block) and the softmax, a row reduction inside one warpgroup (no cross-warp exchange), then publishes the
  block's running max and P (bf16, 8 KB, the PV wgmma's shared-memory A operand) and arrives on `pub`;
- both warpgroups run PV on their own 256 output columns of every block, rescaling by every block's alpha, so both
  accumulators follow the sequential online softmax (the same running max and P as the shipped kernel);
- warpgroup 1 issues the QK^T of its block before waiting for warpgroup 0's P, and its PV of the even block before
  its own softmax (asynchronous wgmma), so each warpgroup's softmax runs under the other's MMAs;
- one P buffer and one max: before publishing, the owner waits on the other warpgroup's `pfree` (the other has run
  its PV on the P it published; the owner's own reads of it are finished by then). Two buffers would put the paged
  path at 228 KB of shared memory, over the 227 KB an SM gives a CTA.
The row sums stay per warpgroup (its own blocks, rescaled like its accumulator) and are added once at the end.
Limits of this version: an even number of 64-slot blocks (every shape below; the host wrapper checks), and a block's
tile returns to the producer only after both warpgroups' PV, so the next pair's QK^T can wait for a gather.

Offline (triton 3.6, sm_90a): shared memory 206,944 B with bf16 rows, 225,424 B paged; the 168-register launch of 12
warps, then 208 registers for warpgroup 1, 200 for warpgroup 0 (the default partition), 96 for the producer; no
spills (see `flip` below). To read next to the first timing: ptxas inserts one warpgroup.wait before warpgroup 1's
PV of block a (C7517), so that PV waits for warpgroup 1's QK^T of block b, which has usually finished by then (it
was issued before the wait for block a's P).

Measures, at bench_flashmla's prefill shape (s_q 4,096, h 64, 128 window + 512 compressed slots, 131k context) with
bf16 rows and the paged FP8/FP4 cache, and at decode batch 64 / 128 / 256 (CUDA-graph replay): the shipped kernel
and this one in the same run, relative L2 between them (all queries) and against the reference (first 256). Writes
$OUT/exp_flashmla_seesaw.json.

    cd benchmarks && python3 exp_flashmla_seesaw.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_flashmla import S_Q, SCALE, TOPK_C, W, bench, bench_graph, decode_case, environment, prefill_case
from mini_flashmla import api, reference
from mini_flashmla.sparse_attn_gluon_kernel import (BLOCK_N, D, HEADS, IDS_SLOTS, LN2, LOG2E, NEG_INIT, PRODUCER_REGS,
                                                    PRODUCER_WARPS, TILE_SHARED, _producer, _query_blocks,
                                                    _ring_buffers)
from mini_flashmla.sparse_attn_kernel import FORMAT_BF16, FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

HALF: gl.constexpr = gl.constexpr(D // 2)  # output columns per warpgroup
# 2 x 128 x 208 + 128 x 96 = 65,536 registers: both consumer warpgroups and the producer at once
CONSUMER_REGS: gl.constexpr = gl.constexpr(208)
Q_HALF_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # [64, 256] bf16, one warpgroup
S_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
O_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
STATS_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])


@gluon.jit
def _publish(p, m_new, p_smem, m_smem, pub_bar):
    """The owner's P (rounded to bf16, as the reference) and running max of its block; then one arrival on pub_bar
    (after Gluon's partition barrier: every thread has stored). The caller has waited until both buffers are free."""
    p_smem.store(p.to(gl.bfloat16))
    m_smem.store(m_new)
    fence_async_shared()  # P's generic-proxy stores before both warpgroups' wgmma reads
    mbarrier.arrive(pub_bar, count=1)


@gluon.jit
def _own_softmax(s, ids_slot, num_rows, qk_scale_log2, m_run, l_own):
    """The owner's online-softmax step on its block (s: the finished QK^T accumulator; -inf on empty slots) ->
    (running max, alpha, P in fp32, row sum of the owner's blocks)."""
    ids = ids_slot.load(gl.SliceLayout(0, S_WG))  # -1 past the list's end
    valid = (ids >= 0) & (ids < num_rows)
    s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_run, gl.max(s, 1))
    alpha = gl.exp2(m_run - m_new)
    p = gl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_own * alpha + gl.sum(p, 1)


@gluon.jit
def _adopt(m_smem, m_run, l_own, acc, full_bar, pub_bar, phase):
    """The other warpgroup's block: once its tile and its P and max are in, rescale this warpgroup's row sum and
    accumulator to the new running max -> (running max, row sum, accumulator)."""
    mbarrier.wait(full_bar, phase)
    mbarrier.wait(pub_bar, phase)
    fence_async_shared()  # the tile's cp.async writes (bf16 rows) before this warpgroup's wgmma reads them
    m_new = m_smem.load(gl.SliceLayout(1, S_WG))
    alpha = gl.exp2(m_run - m_new)
    return m_new, l_own * alpha, acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_WG), assert_trivial=True)[:, None]


@gluon.jit
def _seesaw_consumer(q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, pfree, both, q_ptr,
                     stride_q_s, stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr, stride_out_s,
                     stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: the softmax of blocks WG, WG + 2, ..., PV of every block on output columns
    WG * 256 .. WG * 256 + 255; writes those columns of out and (WG 0) lse."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_HALF_COPY))
    dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, Q_HALF_COPY))
    async_copy.async_copy_global_to_shared(q_smem.index(0).slice(WG * HALF, HALF, dim=1),
                                           q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()  # this half of Q (cp.async, generic proxy) before either warpgroup's wgmma reads it
    mbarrier.arrive(both, count=1)  # after the partition barrier: this warpgroup's half of Q has landed
    mbarrier.wait(both, 0)

    m_run = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_WG))
    l_own = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_WG))
    acc = gl.full([HEADS, HALF], 0.0, gl.float32, O_WG)
    zero_s = gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_WG)
    for pair in range(n_blocks // 2):
        blk_a = 2 * pair
        phase = pair & 1
        # Q and the tiles at indices the compiler cannot prove constant (a_rows >= 0 at run time, so flip is 0):
        # with constant ones the QK^T's 32 pairs of shared-memory descriptors are loop-invariant, hoisted and, in
        # warpgroup 0, spilled (offline: 536 bytes of stack, LDL.64 between its QK^T MMAs; none this way).
        flip = ((pair * a_rows) < 0).to(gl.int32)
        tile_a = tiles.index(flip)
        tile_b = tiles.index(1 - flip)
        if WG == 0:
            # block a: QK^T, softmax (the running max after the previous pair's block b), publish, PV
            mbarrier.wait(full.index(0), phase)
            fence_async_shared()  # Q's and the bf16 rows' cp.async (generic-proxy) writes before wgmma's reads
            s = warpgroup_mma(q_smem.index(flip), tile_a.permute((1, 0)), zero_s, use_acc=False)
            m_run, alpha, p, l_own = _own_softmax(s, ids_smem.index(blk_a % IDS_SLOTS),
                                                  gl.where(blk_a < a_blocks, a_rows, b_rows), qk_scale_log2, m_run,
                                                  l_own)
            mbarrier.wait(pfree.index(1), phase ^ 1)  # warpgroup 1 has run its PV on the previous pair's P
            _publish(p, m_run, p_smem, m_smem, pub.index(0))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_WG), assert_trivial=True)[:, None]
            acc = warpgroup_mma(p_smem, tile_a.slice(0, HALF, dim=1), acc)
            mbarrier.arrive(pfree.index(0), count=1)
            mbarrier.arrive(empty.index(0), count=1)
            # block b: warpgroup 1's P and max
            m_run, l_own, acc = _adopt(m_smem, m_run, l_own, acc, full.index(1), pub.index(1), phase)
            acc = warpgroup_mma(p_smem, tile_b.slice(0, HALF, dim=1), acc)
            mbarrier.arrive(empty.index(1), count=1)
        else:
            # block b's QK^T first, so that it runs while warpgroup 0 does block a's softmax
            mbarrier.wait(full.index(1), phase)
            fence_async_shared()
            s_token = warpgroup_mma(q_smem.index(flip), tile_b.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            # block a: warpgroup 0's P and max; its PV runs under this warpgroup's softmax of block b
            m_run, l_own, acc = _adopt(m_smem, m_run, l_own, acc, full.index(0), pub.index(0), phase)
            acc_token = warpgroup_mma(p_smem, tile_a.slice(HALF, HALF, dim=1), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=[s_token])  # the QK^T, issued first, is done; the PV may still run
            m_run, alpha, p, l_own = _own_softmax(s, ids_smem.index((blk_a + 1) % IDS_SLOTS),
                                                  gl.where(blk_a + 1 < a_blocks, a_rows, b_rows), qk_scale_log2,
                                                  m_run, l_own)
            acc = warpgroup_mma_wait(0, deps=[acc_token])  # this warpgroup's read of block a's P is done
            mbarrier.arrive(empty.index(0), count=1)
            mbarrier.wait(pfree.index(0), phase)  # so is warpgroup 0's
            _publish(p, m_run, p_smem, m_smem, pub.index(1))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_WG), assert_trivial=True)[:, None]
            acc = warpgroup_mma(p_smem, tile_b.slice(HALF, HALF, dim=1), acc)
            mbarrier.arrive(pfree.index(1), count=1)
            mbarrier.arrive(empty.index(1), count=1)

    # the row sums: each warpgroup's own blocks, at the same final max; added in one order in both
    l_smem.index(WG).store(l_own)
    mbarrier.arrive(both, count=1)  # the rendezvous's second phase: both warpgroups' sums are stored
    mbarrier.wait(both, 1)
    l_i = l_smem.index(0).load(gl.SliceLayout(1, S_WG)) + l_smem.index(1).load(gl.SliceLayout(1, S_WG))
    rows = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_WG))
    denom = l_i
    if HAS_SINK:
        denom = denom + gl.exp2(gl.load(sink_ptr + rows) * LOG2E - m_run)  # sink in the denominator only
    if WG == 0:
        lse = gl.where(l_i > 0, (m_run + gl.log2(l_i)) * LN2, float("-inf"))
        gl.store(lse_ptr + sq * stride_lse_s + rows, lse)
    denom = gl.convert_layout(denom, gl.SliceLayout(1, O_WG), assert_trivial=True)
    o = gl.where(denom[:, None] > 0, acc / denom[:, None], 0.0).to(gl.bfloat16)
    out_heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, O_WG))
    out_dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, O_WG))
    gl.store(out_ptr + sq * stride_out_s + out_heads[:, None] * stride_out_h + out_dims[None, :], o)


@gluon.jit(do_not_specialize=["a_len", "a_rows", "b_len", "b_rows"])
def seesaw_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_rows,
    sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    qk_scale_log2,
    A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr, HAS_B: gl.constexpr, HAS_SINK: gl.constexpr,
):
    """sparse_mla_fwd_gluon_kernel's arguments and outputs; grid (s_q, h // 64), num_warps 4 (consumer warpgroup 0;
    warpgroup 1 and the producer come on top). The number of 64-slot blocks must be even."""
    a_ids_ptr, b_ids_ptr, a_blocks, n_blocks = _query_blocks(a_ids_ptr, stride_a_ids, a_len, b_ids_ptr, stride_b_ids,
                                                             b_len, HAS_B)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [1, HEADS, D], TILE_SHARED)  # indexed by flip (see the loop)
    tiles, raw_vals, raw_scales, ids_smem, full, empty = _ring_buffers(A_FORMAT, 2)  # both consumer warpgroups
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, BLOCK_N], TILE_SHARED)
    m_smem = gl.allocate_shared_memory(gl.float32, [HEADS], STATS_SHARED)
    l_smem = gl.allocate_shared_memory(gl.float32, [2, HEADS], STATS_SHARED)
    # pub.index(w): warpgroup w has published its block's P and max; pfree.index(w): warpgroup w has run its PV on
    # that P (the other warpgroup's read of it is ordered before its own next publish by program order or its
    # MMA wait); both: the consumers' rendezvous (phase 0: Q loaded, phase 1: row sums stored)
    pub = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    both = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(pub.index(w), count=1)
        mbarrier.init(pfree.index(w), count=1)
    mbarrier.init(both, count=2)
    gl.warp_specialize(
        [(_seesaw_consumer, (q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, pfree, both, q_ptr,
                             stride_q_s, stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr,
                             stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 0)),
         (_seesaw_consumer, (q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, pfree, both, q_ptr,
                             stride_q_s, stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr,
                             stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 1)),
         (_producer, (tiles, raw_vals, raw_scales, ids_smem, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr,
                      a_len, a_rows, b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def launch_seesaw(q: torch.Tensor, source_a: tuple, source_b: tuple | None, sm_scale: float,
                  attn_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """api._launch_gluon's contract on seesaw_kernel; source_* = (rows, ids [s_q, n], FORMAT value)."""
    s_q, h, _ = q.shape
    out, lse, (a_rows, a_ids, a_format), (b_rows, b_ids, b_format) = api._attn_outputs_and_sources(q, source_a,
                                                                                                  source_b)
    b_len = b_ids.shape[1] if source_b is not None else 0
    blocks = -(-a_ids.shape[1] // 64) + -(-b_len // 64)
    if blocks % 2 or h % 64:
        raise ValueError(f"the experiment takes an even number of 64-slot blocks and whole 64-head groups, got "
                         f"{blocks} blocks, h = {h}")
    sink = attn_sink.float().contiguous() if attn_sink is not None else lse  # placeholder when absent
    seesaw_kernel[(s_q, h // 64)](
        q, q.stride(0), q.stride(1),
        a_rows, a_ids, a_ids.stride(0), a_ids.shape[1], a_rows.shape[0],
        b_rows, b_ids, b_ids.stride(0), b_len, b_rows.shape[0],
        sink, out, out.stride(0), out.stride(1), lse, lse.stride(0), sm_scale * LOG2E.value,
        A_FORMAT=a_format, B_FORMAT=b_format, HAS_B=source_b is not None, HAS_SINK=attn_sink is not None,
        num_warps=4, maxnreg=65536 // ((8 + PRODUCER_WARPS.value) * 32) // 8 * 8,
    )
    return out, lse


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def main() -> None:
    dev = torch.device("cuda")
    result = environment(dev)
    flops = 2 * S_Q * HEADS.value * (W + TOPK_C) * (D.value + D.value)
    c = prefill_case(dev)
    paged = ((c["window_cache"], c["wid"], FORMAT_FP8_WINDOW.value),
             (c["compressed_cache"], c["cid"], FORMAT_FP4_COMPRESSED.value))
    cases = {"bf16": ((c["kv"], c["idx"], FORMAT_BF16.value), None), "paged": paged}
    for name, (source_a, source_b) in cases.items():
        ours = launch_seesaw(c["q"], source_a, source_b, SCALE, c["sink"])
        shipped = api._launch_gluon(c["q"], source_a, source_b, SCALE, c["sink"])
        result[f"prefill_{name}_rel_l2_vs_shipped"] = rel_l2(ours[0], shipped[0])
        result[f"prefill_{name}_lse_max_diff_vs_shipped"] = (ours[1] - shipped[1]).abs().max().item()
        if name == "bf16":
            ref, _ = reference.sparse_attn_ref(c["q"][:256], c["kv"], c["idx"][:256], SCALE, c["sink"])
        else:
            ref, _ = reference.sparse_attn_paged_ref(c["q"][:256], c["window_cache"], c["compressed_cache"],
                                                     c["wid"][:256], c["cid"][:256], SCALE, c["sink"])
        result[f"prefill_{name}_rel_l2_vs_reference_first256"] = rel_l2(ours[0][:256], ref)
        for kernel, fn in (("shipped", lambda: api._launch_gluon(c["q"], source_a, source_b, SCALE, c["sink"])),
                           ("seesaw", lambda: launch_seesaw(c["q"], source_a, source_b, SCALE, c["sink"]))):
            result[f"prefill_{name}_{kernel}_tflops"] = flops / bench(fn) / 1e9
        print({k: v for k, v in result.items() if k.startswith(f"prefill_{name}")}, flush=True)
    g = torch.Generator(device=dev).manual_seed(1)
    for batch in (64, 128, 256):
        q, window_cache, compressed_cache, wid, cid, sink = decode_case(dev, batch, g)
        sources = ((window_cache, wid, FORMAT_FP8_WINDOW.value), (compressed_cache, cid, FORMAT_FP4_COMPRESSED.value))
        result[f"decode_b{batch}_rel_l2_vs_shipped"] = rel_l2(launch_seesaw(q, *sources, SCALE, sink)[0],
                                                              api._launch_gluon(q, *sources, SCALE, sink)[0])
        result[f"decode_b{batch}_shipped_us"] = 1e3 * bench_graph(lambda: api._launch_gluon(q, *sources, SCALE, sink))
        result[f"decode_b{batch}_seesaw_us"] = 1e3 * bench_graph(lambda: launch_seesaw(q, *sources, SCALE, sink))
        print({k: v for k, v in result.items() if k.startswith(f"decode_b{batch}")}, flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_seesaw.json"), "w") as f:
        json.dump(result, f, indent=1)
    for name in ("bf16", "paged"):
        print(f"| prefill {name} | {result[f'prefill_{name}_shipped_tflops']:.1f} | "
              f"{result[f'prefill_{name}_seesaw_tflops']:.1f} TFLOP/s | "
              f"{result[f'prefill_{name}_seesaw_tflops'] / result[f'prefill_{name}_shipped_tflops']:.2f}x |")
    for batch in (64, 128, 256):
        print(f"| decode b{batch} | {result[f'decode_b{batch}_shipped_us']:.1f} | "
              f"{result[f'decode_b{batch}_seesaw_us']:.1f} us | "
              f"{result[f'decode_b{batch}_shipped_us'] / result[f'decode_b{batch}_seesaw_us']:.2f}x |")


if __name__ == "__main__":
    main()
