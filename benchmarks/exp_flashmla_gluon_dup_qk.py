"""Experiment (issue 5): the Gluon sparse-attention kernel with QK^T computed whole by each consumer warpgroup, so
that the two warpgroups never exchange anything. Written in session 13 after its last GPU run: not yet run.

Why (docs/reports/flashmla-gluon.md, "What would move it next"): with bf16 rows the shipped kernel is consumer-bound,
3.35 of its 3.50 us per 64-slot block, and only ~1.2 us of that is MMAs. Its consumers are one 8-warp partition
that splits S by slots across the two warpgroups and PV by output columns. Every block therefore reduces the row
max across the warpgroups and moves P between them through shared memory, with partition-wide barriers.
How (this kernel): the shipped producer partition unchanged, and two consumer partitions of one warpgroup each.
Each computes S = Q K^T for all 64 slots itself (m64n64 over the 512 dims, so the QK^T MMA is done twice per
block: ~1.2 -> ~1.8 us of tensor work), keeps the whole softmax in its own registers, and multiplies P into its
256 output columns. The only cross-partition traffic is the ring's mbarriers and, once per program, Q: each
warpgroup copies half of Q and an mbarrier makes both halves visible to both.
Numerics: each warpgroup computes the same S for a block (the same MMA over the same K order), so both hold the same
softmax state. Row sums are accumulated per block rather than per column as shipped, so the outputs can differ from
the shipped kernel's by fp32 rounding. Checks: relative L2 against the shipped kernel and against the pure-torch
reference (first 256 queries, both row formats).
Times both kernels at bench_flashmla's prefill shape (bf16 rows and the paged FP8 + FP4 cache; the paged case is
bound by the producer, so it should not change) and decode at batch 132 / 256, by CUDA-graph replay.
Writes $OUT/exp_flashmla_gluon_dup_qk.json.

    cd benchmarks && timeout 200 python3 exp_flashmla_gluon_dup_qk.py
"""

from __future__ import annotations

import json
import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

import bench_flashmla as bench
from exp_gemm_gluon_v3 import smoke_in_child
from bench_flashmla import SCALE, bench_graph, decode_case, environment, prefill_case
from mini_flashmla import api, reference
from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring
from mini_flashmla.sparse_attn_gluon_kernel import (BLOCK_N, HEADS, LN2, LOG2E, NEG_INIT, PRODUCER_WARPS, TILES,
                                                    _allocate_buffers, _block_source, _producer)
from mini_flashmla.sparse_attn_kernel import FORMAT_BF16, FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW

# One warpgroup per consumer partition: 16 heads per warp, all 64 slots (S) or 256 output columns (O) per warpgroup.
HALF: gl.constexpr = gl.constexpr(256)
Q_HALF_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # [64, 256] bf16
S_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
O_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
P_WG: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_WG, k_width=2)
# 12 warps resident (4 + 4 consumers, the producer's 4): 168 registers each at launch, then setmaxnreg. A consumer
# needs ~245 (the [64, 256] fp32 accumulator 128, S and P 32 + 32 + 16, the block's 16 slot ids): offline (triton
# 3.6, ptxas sm_90a) the least spilling split with bf16 rows gives the consumers 232 and the producer (cp.async
# addresses only) 40: 116 bytes of spill stores (224-348 at the other splits tried). With quantized rows the producer
# keeps the shipped 96 for the dequantization, the consumers 208: 256 bytes. Both are timed as they are; if the idea
# pays, the slot ids are the registers to win back (a per-block validity bitmask from the producer).
REGS = {"bf16": (232, 40), "quantized": (208, 96)}


@gluon.jit
def _consumer_wg(q_smem, tiles, full, empty, q_ready, q_ptr, stride_q_s, stride_q_h, n_blocks, a_blocks, a_ids_ptr,
                 a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr,
                 stride_lse_s, qk_scale_log2, HAS_SINK: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: the whole online softmax of the program's 64 heads, and PV into output columns
    WG * 256 .. WG * 256 + 255. Writes its half of out, and (WG 0) lse."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_HALF_COPY))
    dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, Q_HALF_COPY))
    async_copy.async_copy_global_to_shared(q_smem.slice(WG * HALF, HALF, dim=1),
                                           q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    mbarrier.arrive(q_ready, count=1)  # after the partition barrier: this warpgroup's half of Q has landed
    mbarrier.wait(q_ready, 0)  # and the other's

    m_i = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_WG))
    l_i = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_WG))
    acc = gl.full([HEADS, HALF], 0.0, gl.float32, O_WG)
    for blk in range(n_blocks):
        t = blk % TILES
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_WG))
        ids = gl.load(ids_ptr + pos, mask=pos < ids_len, other=-1)  # its latency overlaps the wait below
        valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
        mbarrier.wait(full.index(t), (blk // TILES) & 1)
        fence_async_shared()  # Q's and the bf16 rows' cp.async (generic-proxy) writes before wgmma's reads
        kv = tiles.index(t)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_WG),
                          use_acc=False)
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_WG))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_WG)  # P rounded to bf16 before P.V, as the reference
        acc = warpgroup_mma(p_op, kv.slice(WG * HALF, HALF, dim=1), acc)
        # one thread arrives, after the partition barrier Gluon puts before a single-thread operation: this
        # warpgroup's (synchronous) MMAs on the tile are done; the producer waits for both warpgroups
        mbarrier.arrive(empty.index(t), count=1)

    rows = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_WG))
    denom = l_i
    if HAS_SINK:
        denom = denom + gl.exp2(gl.load(sink_ptr + rows) * LOG2E - m_i)  # sink in the denominator only
    if WG == 0:
        gl.store(lse_ptr + sq * stride_lse_s + rows, gl.where(l_i > 0, (m_i + gl.log2(l_i)) * LN2, float("-inf")))
    denom = gl.convert_layout(denom, gl.SliceLayout(1, O_WG))
    o = gl.where(denom[:, None] > 0, acc / denom[:, None], 0.0).to(gl.bfloat16)
    out_heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, O_WG))
    out_dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, O_WG))
    gl.store(out_ptr + sq * stride_out_s + out_heads[:, None] * stride_out_h + out_dims[None, :], o)


@gluon.jit(do_not_specialize=["a_len", "a_rows", "b_len", "b_rows"])
def sparse_mla_fwd_dup_qk_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_rows,
    sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    qk_scale_log2,
    A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr, HAS_B: gl.constexpr, HAS_SINK: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_NREGS: gl.constexpr,
):
    """sparse_mla_fwd_gluon_kernel's contract (same arguments, outputs and grid), num_warps 4 (consumer 0; consumer 1
    and the producer come from warp_specialize)."""
    sq = gl.program_id(0)
    a_ids_ptr += sq * stride_a_ids
    b_ids_ptr += sq * stride_b_ids
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)

    q_smem, tiles, raw_vals, raw_scales, full, empty = _allocate_buffers(A_FORMAT, 2)  # one consumer arrival each
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=2)
    gl.warp_specialize(
        [(_consumer_wg, (q_smem, tiles, full, empty, q_ready.index(0), q_ptr, stride_q_s, stride_q_h, n_blocks,
                         a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr,
                         stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 0)),
         (_consumer_wg, (q_smem, tiles, full, empty, q_ready.index(0), q_ptr, stride_q_s, stride_q_h, n_blocks,
                         a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr,
                         stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 1)),
         (_producer, (tiles, raw_vals, raw_scales, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                      b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_NREGS])
    _invalidate_ring(full, empty)
    mbarrier.invalidate(q_ready.index(0))


def dup_qk(q, source_a, source_b, sm_scale, attn_sink):
    """api._launch_gluon with this kernel."""
    s_q, h, d = q.shape
    out, lse, (a_rows, a_ids, a_format), (b_rows, b_ids, b_format) = api._attn_outputs_and_sources(q, source_a,
                                                                                                   source_b)
    sink = attn_sink.float().contiguous() if attn_sink is not None else lse
    consumer_regs, producer_regs = REGS["bf16" if a_format == FORMAT_BF16.value else "quantized"]
    sparse_mla_fwd_dup_qk_kernel[(s_q, h // HEADS)](
        q, q.stride(0), q.stride(1),
        a_rows, a_ids, a_ids.stride(0), a_ids.shape[1], a_rows.shape[0],
        b_rows, b_ids, b_ids.stride(0), b_ids.shape[1] if source_b is not None else 0, b_rows.shape[0],
        sink, out, out.stride(0), out.stride(1), lse, lse.stride(0), sm_scale * LOG2E.value,
        A_FORMAT=a_format, B_FORMAT=b_format, HAS_B=source_b is not None, HAS_SINK=attn_sink is not None,
        CONSUMER_REGS=consumer_regs, PRODUCER_NREGS=producer_regs, num_warps=4,
        maxnreg=65536 // ((8 + PRODUCER_WARPS) * 32) // 8 * 8,
    )
    return out, lse


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def smoke(result) -> None:
    """Child process: 8 queries, 300 bf16 rows, 640 slots (some empty), against the shipped kernel."""
    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(8, 64, 512, device="cuda", generator=g).bfloat16()
    kv = torch.randn(300, 512, device="cuda", generator=g).bfloat16()
    idx = torch.randint(-1, 300, (8, 640), device="cuda", generator=g, dtype=torch.int32)
    sink = torch.randn(64, device="cuda", generator=g)
    source = (kv, idx, FORMAT_BF16.value)
    out, lse = dup_qk(q, source, None, SCALE, sink)
    want, want_lse = api._launch_gluon(q, source, None, SCALE, sink)
    result.put(dict(rel_l2_vs_shipped=rel_l2(out, want), lse_max_abs_diff=(lse - want_lse).abs().max().item()))


def main() -> None:
    print("smoke:", smoke_in_child(smoke, 120, "the duplicated-QK^T attention kernel's smoke call"), flush=True)
    dev = torch.device("cuda")
    result = environment(dev)
    c = prefill_case(dev)
    q, sink = c["q"], c["sink"]
    cases = {
        "bf16": ((c["kv"], c["idx"], FORMAT_BF16.value), None),
        "paged": ((c["window_cache"], c["wid"], FORMAT_FP8_WINDOW.value),
                  (c["compressed_cache"], c["cid"], FORMAT_FP4_COMPRESSED.value)),
    }
    flops = 2 * bench.S_Q * bench.H * (bench.W + bench.TOPK_C) * (bench.D + bench.D)  # as bench_flashmla counts
    for case, (source_a, source_b) in cases.items():
        shipped_out, _ = api._launch_gluon(q, source_a, source_b, SCALE, sink)
        out, lse = dup_qk(q, source_a, source_b, SCALE, sink)
        result[f"{case}_rel_l2_vs_shipped"] = rel_l2(out, shipped_out)
        if case == "bf16":
            ref, ref_lse = reference.sparse_attn_ref(q[:256], c["kv"], c["idx"][:256], SCALE, sink)
        else:
            ref, ref_lse = reference.sparse_attn_paged_ref(q[:256], c["window_cache"], c["compressed_cache"],
                                                           c["wid"][:256], c["cid"][:256], SCALE, sink)
        result[f"{case}_rel_l2_vs_reference_first256"] = rel_l2(out[:256], ref)
        result[f"{case}_shipped_tflops"] = flops / bench_graph(lambda: api._launch_gluon(q, source_a, source_b, SCALE,
                                                                                         sink)) / 1e9
        result[f"{case}_dup_qk_tflops"] = flops / bench_graph(lambda: dup_qk(q, source_a, source_b, SCALE, sink)) / 1e9
        print(case, {k: v for k, v in result.items() if k.startswith(case)}, flush=True)
    g = torch.Generator(device=dev).manual_seed(1)
    for batch in (132, 256):
        dq, wc, cc, wid, cid, dsink = decode_case(dev, batch, g)
        sources = (wc, wid, FORMAT_FP8_WINDOW.value), (cc, cid, FORMAT_FP4_COMPRESSED.value)
        result[f"decode_b{batch}_shipped_us"] = 1e3 * bench_graph(lambda: api._launch_gluon(dq, *sources, SCALE, dsink))
        result[f"decode_b{batch}_dup_qk_us"] = 1e3 * bench_graph(lambda: dup_qk(dq, *sources, SCALE, dsink))
        result[f"decode_b{batch}_rel_l2_vs_shipped"] = rel_l2(dup_qk(dq, *sources, SCALE, dsink)[0],
                                                              api._launch_gluon(dq, *sources, SCALE, dsink)[0])
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_gluon_dup_qk.json"), "w") as f:
        json.dump(result, f, indent=1)
    for k, v in result.items():
        if isinstance(v, float):
            print(f"{k:45s} {v:.6g}")


if __name__ == "__main__":
    main()
