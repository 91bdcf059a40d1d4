"""Experiment (issue 5): launch tiles of the indexer score kernel at the benchmark's shape (4,096 queries x 32 heads x
128 dims against 65,536 FP4 keys of one sequence, 131k context), which measured 0.59-0.60x of cuBLAS FP8 per-tensor
scaled_mm of the same GEMM (target 0.6x) with the launch of sessions 5-12: BLOCK_K 128 keys x BLOCK_Q 4 queries (an
MMA of [128 keys, 128] x [128, 4 x 32 (query, head) columns]), 8 warps, Triton's default pipelining (3 stages), and
enough queries per program for ~4 programs per SM. This sweeps the key tile, the query tile, warps, stages and
queries per program; every candidate's scores are compared with the routed launch's ("shipped": the API as it
stands; the dot products are exact in fp32, so only the 32-head sum's order can move a score, by one bf16 ulp).
Session 13 run 3 ran it with the old launch routed; the 64-key tile it found (7.29 against 9.65 ms, equal scores)
ships since (docs/reports/flashmla-indexer.md). Writes $OUT/exp_indexer_tiles.json.

--per-query: the decode shape of the other path, one query per sequence (batch 64 and 256) each with its own list of
65,536 keys, timed by CUDA-graph replay. Session 14 run 2 swept the then-routed launch (indexer_scores_kernel, one
program per query and 128 keys): 0.72-0.80 ms / 2.84-3.38 ms at batch 64 / 256, ~0.38 TB/s of keys whatever the
tile. Since then api.indexer_scores routes it to indexer_scores_per_query_kernel (a program walks a run of its
query's key tiles, query loaded once, loads pipelined). This times the old launch, then the new kernel at key tiles
64 / 128, 1-3 stages, 4 / 8 warps, ~4 / 8 programs per SM, and the integer against the inline-PTX e2m1 decode, each
checked against the routed scores (equal: same products and sums). Writes $OUT/exp_indexer_tiles_per_query.json.

    cd benchmarks && timeout 200 python3 exp_indexer_tiles.py [--per-query]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys

import torch
from bench_flashmla import INDEX_DIM as D
from bench_flashmla import INDEX_HEADS as N_HEADS
from bench_flashmla import (INDEXER_DECODE_BATCHES, N_COMPRESSED, S_Q, bench, bench_graph, environment,
                            indexer_decode_case, indexer_peer_ms, indexer_prefill_case)
from mini_deepgemm._backend import sm_count
from mini_flashmla import api
from mini_flashmla.indexer_kernel import indexer_scores_kernel, indexer_scores_per_query_kernel


def launch(q, w, cache, visible, rows, out, block_q, block_k, num_warps, num_stages, programs_per_sm):
    """indexer_scores_kernel on one shared key list, as api.indexer_scores but with every launch choice given."""
    key_tiles = math.ceil(N_COMPRESSED / block_k)
    query_tiles = math.ceil(S_Q / block_q)
    sms = sm_count(q.device)
    queries_per_program = block_q * max(1, min(64, key_tiles * query_tiles // (programs_per_sm * sms)))
    grid = (key_tiles, math.ceil(S_Q / queries_per_program))
    indexer_scores_kernel[grid](
        q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], rows, 0, visible, out, out.stride(0),
        S_Q, N_COMPRESSED, queries_per_program, H=N_HEADS, D=D, BLOCK_Q=block_q, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)


def measure(row: dict, call, out: torch.Tensor, want: torch.Tensor, key: str, timer) -> dict:
    """One sweep entry: call (which writes out) once, out's mismatches against want as row[key], then row["ms"] by
    timer. A launch that fails (out of shared memory or registers) is recorded as row["error"] and the sweep goes
    on. Prints the row and returns it."""
    try:
        out.fill_(7.0)
        call()
        row[key] = int((out != want).sum())
        row["ms"] = timer(call)
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        row["error"] = repr(exc)[:200]
    print(row, flush=True)
    return row


def prefill_baseline(dev: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, dict]:
    """(bench_flashmla's prefill indexer case, the routed API's scores on it, a result dict with the environment,
    the routed API's time and the cuBLAS FP8 peer's)."""
    case = indexer_prefill_case(dev)
    result = environment(dev)
    result["shipped_ms"] = bench(lambda: api.indexer_scores(*case))
    result["fp8_scaled_mm_ms"] = indexer_peer_ms(dev, N_HEADS, D)
    return case, api.indexer_scores(*case), result


def per_query() -> None:
    """The per-query path at decode shapes (see the module docstring)."""
    dev = torch.device("cuda")
    result = environment(dev)
    rows_out = []
    for batch in INDEXER_DECODE_BATCHES:
        q, w, cache, visible, key_rows = indexer_decode_case(dev, batch)
        routed = api.indexer_scores(q, w, cache, visible, key_rows)
        routed_ms = bench_graph(lambda: api.indexer_scores(q, w, cache, visible, key_rows))
        out = torch.empty_like(routed)
        sms = sm_count(dev)

        def old_launch():  # the launch routed until session 14 run 2: indexer_scores_kernel, one query, 128 keys
            indexer_scores_kernel[(math.ceil(N_COMPRESSED / 128), batch)](
                q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], key_rows, key_rows.stride(0),
                visible, out, out.stride(0), batch, N_COMPRESSED, 1, H=N_HEADS, D=D, BLOCK_Q=1, BLOCK_K=128,
                num_warps=4)

        def new_launch(block_k, num_stages, num_warps, per_sm, asm):
            tiles = max(1, min(64, math.ceil(N_COMPRESSED / block_k) * batch // (per_sm * sms)))
            indexer_scores_per_query_kernel[(batch, math.ceil(N_COMPRESSED / (block_k * tiles)))](
                q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], key_rows, key_rows.stride(0),
                key_rows, key_rows.stride(0), visible, out, out.stride(0), N_COMPRESSED, N_COMPRESSED, block_k * tiles,
                H=N_HEADS, D=D, BLOCK_K=block_k, STAGES=num_stages, ASM=asm, GROUP=0, num_warps=num_warps)

        configs = [("old", None)] + [("new", c) for c in itertools.product((64, 128), (1, 2, 3), (4,), (4,), (True,))]
        configs += [("new", c) for c in ((128, 2, 8, 4, True), (128, 2, 4, 8, True), (64, 2, 4, 8, True),
                                         (128, 2, 4, 4, False))]
        for kind, cfg in configs:
            row = dict(batch=batch, kernel=kind, routed_ms=routed_ms, key_bytes=batch * N_COMPRESSED * 68)
            if cfg:
                row.update(zip(("block_k", "num_stages", "num_warps", "programs_per_sm", "asm"), cfg))
            call = old_launch if kind == "old" else (lambda cfg=cfg: new_launch(*cfg))
            rows_out.append(measure(row, call, out, routed, "mismatches_vs_routed", bench_graph))
        torch.cuda.empty_cache()
    result["rows"] = rows_out
    with open(os.path.join(os.environ.get("OUT", "."), "exp_indexer_tiles_per_query.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| batch | kernel | block_k | stages | warps | programs/SM | asm | ms | routed ms | key GB/s | mismatches |")
    for r in sorted((r for r in rows_out if "ms" in r), key=lambda r: (r["batch"], r["ms"])):
        cfg = " | ".join(str(r.get(k, "-")) for k in ("block_k", "num_stages", "num_warps", "programs_per_sm", "asm"))
        print(f"| {r['batch']} | {r['kernel']} | {cfg} | {r['ms']:.3f} | {r['routed_ms']:.3f} | "
              f"{r['key_bytes'] / r['ms'] / 1e6:.0f} | {r['mismatches_vs_routed']} |")


def main() -> None:
    (q, w, cache, visible, rows), shipped, result = prefill_baseline(torch.device("cuda"))
    out = torch.empty_like(shipped)
    rows_out = []
    grid = itertools.product((4, 8), (64, 128, 256), (4, 8), (1, 2, 3), (4, 8))
    for block_q, block_k, num_warps, num_stages, programs_per_sm in grid:
        if block_q * block_k // num_warps > 128:
            continue  # over 128 fp32 accumulator registers per thread (N_HEADS x block_q x block_k / threads)
        row = dict(block_q=block_q, block_k=block_k, num_warps=num_warps, num_stages=num_stages,
                   programs_per_sm=programs_per_sm)
        args = (q, w, cache, visible, rows, out, block_q, block_k, num_warps, num_stages, programs_per_sm)
        rows_out.append(measure(row, lambda: launch(*args), out, shipped, "mismatches_vs_shipped", bench))
    result["rows"] = rows_out
    with open(os.path.join(os.environ.get("OUT", "."), "exp_indexer_tiles.json"), "w") as f:
        json.dump(result, f, indent=1)
    ok = sorted((r for r in rows_out if "ms" in r), key=lambda r: r["ms"])
    print(f"shipped {result['shipped_ms']:.3f} ms = {result['fp8_scaled_mm_ms'] / result['shipped_ms']:.3f}x of "
          f"FP8 scaled_mm ({result['fp8_scaled_mm_ms']:.3f} ms)")
    print("| block_q | block_k | warps | stages | programs/SM | ms | x scaled_mm | mismatches |")
    for r in ok[:12]:
        print(f"| {r['block_q']} | {r['block_k']} | {r['num_warps']} | {r['num_stages']} | {r['programs_per_sm']} | "
              f"{r['ms']:.3f} | {result['fp8_scaled_mm_ms'] / r['ms']:.3f} | {r['mismatches_vs_shipped']} |")


if __name__ == "__main__":
    per_query() if "--per-query" in sys.argv else main()
