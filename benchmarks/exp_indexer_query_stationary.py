"""Experiment (issue 5): the indexer's shared-key path (prefill) with the queries held by the program and the keys
streamed, against the shipped launch. Written in session 14 after its last GPU run: not yet run.

Why. The shipped kernel (indexer_kernel.indexer_scores_kernel) gives each program 64 keys. It decodes them once,
then walks up to 256 queries, four per MMA, loading each group's 4 x 32 head rows of q (32 KB of bf16) from
global memory into shared memory. Its loop body, compiled offline for sm_90a (triton 3.6, 4 queries x 64 keys,
8 warps), has 689 SASS instructions. About 280 of them move q: 128 IADD3, 81 LDG and 65 STS. The score
epilogue is ~170, and there are 8 HGMMAs. Counted over the benchmark shape (4,096 queries x 65,536 keys), the
program grid moves q 1,024 times: ~34 GB from L2, against ~4.5 MB of packed keys. At the measured 7.35 ms that is
~4.6 TB/s of L2 traffic for q alone.
How. `query_stationary_kernel` (below) turns this around, as the decode kernel (indexer_scores_per_query_kernel)
does for one query:
- a program loads BLOCK_Q queries' q and head weights once;
- it walks a run of BLOCK_K-key tiles of the shared key list, decoding each tile with the inline-PTX e2m1
  conversion. The keys are 4.3 KB per 64-key tile, L2-resident: 4.5 MB in all;
- it scores each tile with the package's `_score_tile`, then masks by each query's visible count and stores.
Per key tile the program now moves 4.3 KB of packed keys instead of 32 KB of q per 4 queries. The cost is the
decode: it now happens once per key tile and query block, not once per 64 keys for up to 256 queries. Offline
(triton 3.6, sm_90a, loop body per 64 keys) that is 858 SASS instructions for 4 queries (shipped: 689), 1,097 for 8
(548 per 4 queries) and 1,686 for 16 (421 per 4; 84 bytes of spills). So the experiment tests whether the L2
traffic or the instruction count binds, and how many queries per program pay for the decode.
Numerics: the same helpers as the shipped kernel (`_dequant_keys`, `_score_tile`), so the same exact 128-term dot
products and the same bf16 rounding points. Only the 32-head fp32 sum may be ordered differently, by at most one
bf16 ulp and rarely; the mismatch count against the shipped scores is reported.
Sweep: BLOCK_Q 4 / 8 queries per MMA, BLOCK_K 64 / 128 keys, 4 / 8 warps, 1 / 2 stages, at one run per program
(every key); 16 queries x 64 keys; and 4 runs per query block at 4 / 8 / 16 x 64. Configurations over 128 fp32 accumulator registers per thread are skipped. Each is
timed by do_bench (as bench_flashmla times the shipped launch) beside the shipped launch and the cuBLAS FP8 peer
of the same GEMM shape. Writes $OUT/exp_indexer_query_stationary.json.

    cd benchmarks && timeout 240 python3 exp_indexer_query_stationary.py
"""

from __future__ import annotations

import itertools
import json
import math
import os

import torch
import triton
import triton.language as tl

from bench_flashmla import INDEX_DIM as D
from bench_flashmla import INDEX_HEADS as N_HEADS
from bench_flashmla import N_COMPRESSED, S_Q, bench
from exp_indexer_tiles import measure, prefill_baseline
from mini_flashmla.indexer_kernel import _dequant_keys, _score_tile


@triton.jit
def query_stationary_kernel(
    q_ptr, stride_q_s, stride_q_h, w_ptr, stride_w_s, cache_ptr, num_rows, key_rows_ptr, visible_ptr, out_ptr,
    stride_out_s, s_q, n_keys, keys_per_program,
    H: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    """Scores of BLOCK_Q queries (program_id(1)) against the keys [program_id(0) * keys_per_program, + keys_per_program)
    of one shared key list (key_rows int32 [n_keys]); api.indexer_scores' semantics."""
    q_begin = tl.program_id(1) * BLOCK_Q
    col = tl.arange(0, BLOCK_Q * H)
    col_q = q_begin + col // H
    col_ok = col_q < s_q
    q = tl.load(q_ptr + col_q[:, None] * stride_q_s + (col % H)[:, None] * stride_q_h + tl.arange(0, D)[None, :],
                mask=col_ok[:, None], other=0.0)
    w = tl.load(w_ptr + col_q * stride_w_s + col % H, mask=col_ok, other=0.0).to(tl.float32)
    qi = q_begin + tl.arange(0, BLOCK_Q)
    qi_ok = qi < s_q
    visible = tl.load(visible_ptr + qi, mask=qi_ok, other=0)
    first = tl.program_id(0) * keys_per_program
    end = tl.minimum(first + keys_per_program, n_keys)
    for start in tl.range(first, end, BLOCK_K, num_stages=STAGES):
        t = start + tl.arange(0, BLOCK_K)
        t_ok = t < end
        k, row_ok = _dequant_keys(cache_ptr, num_rows, tl.load(key_rows_ptr + t, mask=t_ok, other=-1), D, True)
        score = _score_tile(k, q, w, BLOCK_Q, H)
        seen = row_ok[:, None] & (t[:, None] < visible[None, :])
        tl.store(out_ptr + qi[None, :].to(tl.int64) * stride_out_s + t[:, None],
                 tl.where(seen, score, float("-inf")), mask=t_ok[:, None] & qi_ok[None, :])


def launch(q, w, cache, visible, rows, out, block_q, block_k, num_warps, num_stages, runs) -> None:
    keys_per_program = block_k * math.ceil(N_COMPRESSED / block_k / runs)
    query_stationary_kernel[(math.ceil(N_COMPRESSED / keys_per_program), math.ceil(S_Q / block_q))](
        q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], rows, visible, out, out.stride(0),
        S_Q, N_COMPRESSED, keys_per_program, H=N_HEADS, D=D, BLOCK_Q=block_q, BLOCK_K=block_k, STAGES=num_stages,
        num_warps=num_warps)


def main() -> None:
    (q, w, cache, visible, rows), shipped, result = prefill_baseline(torch.device("cuda"))
    print("shipped", result["shipped_ms"], "ms; cuBLAS FP8 peer", result["fp8_scaled_mm_ms"], "ms", flush=True)
    out = torch.empty_like(shipped)
    configs = [c + (1,) for c in itertools.product((4, 8), (64, 128), (4, 8), (1, 2))]
    configs += [(16, 64, 8, 1, 1), (4, 64, 8, 1, 4), (8, 64, 8, 1, 4), (16, 64, 8, 1, 4)]
    rows_out = []
    for block_q, block_k, num_warps, num_stages, runs in configs:
        if block_q * N_HEADS * block_k // (32 * num_warps) > 128:
            continue  # over 128 fp32 accumulator registers per thread
        row = dict(block_q=block_q, block_k=block_k, num_warps=num_warps, num_stages=num_stages, runs=runs)
        args = (q, w, cache, visible, rows, out, block_q, block_k, num_warps, num_stages, runs)
        rows_out.append(measure(row, lambda: launch(*args), out, shipped, "mismatches_vs_shipped", bench))
        if row.get("mismatches_vs_shipped"):  # out still holds this configuration's scores
            differ = (out != shipped) & torch.isfinite(shipped) & torch.isfinite(out)
            row["max_abs_diff"] = float((out - shipped).abs()[differ].max()) if differ.any() else float("inf")
    result["rows"] = rows_out
    with open(os.path.join(os.environ.get("OUT", "."), "exp_indexer_query_stationary.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| queries x keys per MMA | warps | stages | runs | ms | x shipped | x cuBLAS FP8 | mismatches |")
    for r in sorted((r for r in rows_out if "ms" in r), key=lambda r: r["ms"]):
        print(f"| {r['block_q']} x {r['block_k']} | {r['num_warps']} | {r['num_stages']} | {r['runs']} | {r['ms']:.3f} | "
              f"{result['shipped_ms'] / r['ms']:.2f} | {result['fp8_scaled_mm_ms'] / r['ms']:.2f} | "
              f"{r['mismatches_vs_shipped']} |")


if __name__ == "__main__":
    main()
