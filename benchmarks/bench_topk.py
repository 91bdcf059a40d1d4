"""Exact indexer top-k on CUDA: the reference path (int64 keys + torch.topk + sort) against the radix-select
kernel (mini_flashmla.topk_kernel), at the prefill shape of bench_prefill.py.

- top-k: 4,096 queries x 65,536 ratio-2 keys (131k context), k = 512: reference.indexer_topk_ref vs
  api.topk_of_scores; peer: torch.topk(fp32, sorted=False) values only (the floor of a "k-th value from
  torch.topk, then one selection pass" design).
- candidate blocks: the same scores in blocks of 8 (8,192 blocks), top 2,048, the newest block forced:
  reference.candidate_blocks_ref vs api.candidate_blocks_of_scores (before session 29 both wrote the bool mask,
  reference.candidate_block_mask_ref and the kernel's mask output).
- a sweep of the kernel's loop step and warps, rows held in registers (session 34) and the streaming kernel
  (each result checked equal to the default's), and
  scores + top-k chunked (api.indexer_topk) end to end;
- decode (session 15): top-512 of 65,536 keys for 8-256 queries (the last rows of the same scores, which see every
  key): one program per query against the chunked route at 2-16 key chunks and the routed choice, each checked
  equal to the reference, timed as CUDA-graph replays (bench_flashmla.bench_graph; the engine's decode step runs in
  a graph, so the chunked route's extra launches cost no host time there). Session 15 runs 3-4 timed it with a
  15-replay median of a graph captured here, which the review replaced with bench_graph.
Scores are the real indexer's (random FP4 queries and keys), so ties are as common as in the engine; a second top-k
case rounds them to a few distinct values (most of every row ties). Every new result is checked equal to the
reference's on the full shape. Times: median of CUDA-event timings of single calls after warm-up.

Usage: python3 benchmarks/bench_topk.py [--out PATH] (default $OUT/bench_topk.json or ./bench_topk.json).
BENCH_TOPK_PARTS (comma-separated, default all: levels,blocks,sweep,decode,chunks,indexer) picks the parts; each
kernel configuration compiles on first use (~10 s of ptxas for a row held in registers), so on a fresh machine the
whole file takes ~2.5 min and levels,blocks,decode about a third of it (session 36).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from bench_flashmla import CONTEXT, RATIO, S_Q, bench_graph, environment, indexer_prefill_case
from bench_flashmla import N_COMPRESSED as N_KEYS

import mini_flashmla
from mini_flashmla import api, reference

TOPK = 512  # the shape (S_Q queries x N_KEYS keys, CONTEXT, RATIO) is bench_flashmla's indexer_prefill_case
BLOCK, TOPK_BLOCKS = 8, 2048
WARMUP, REPS = 3, 15
# (loop step, warps). Session 14 run 1 also swept 4- and 2-bit radix digits: exact and 1.2-1.7x slower, so the
# kernel's digit width went back to a fixed byte (docs/reports/flashmla-topk-exact.md).
STEP_SWEEP = [(1024, 4), (2048, 4), (4096, 8), (8192, 8), (8192, 16)]
# Session 34: rows held in registers (api.TOPK_RESIDENT_MAX_PAIRS; only the selection pass loops over steps): the
# top-k alone, (loop step, warps, append), against the streaming kernel's default in the same run. Session 35:
# append = whether a row with few enough ties is selected by appending its candidates (api.TOPK_APPEND_SLOTS_PER_K)
# instead of by the selection pass.
RESIDENT_SWEEP = [(4096, 16, True), (2048, 16, True), (8192, 16, True), (4096, 16, False), (8192, 16, False)]


def median_ms(fn) -> float:
    """Median of REPS single-call CUDA-event timings after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_topk_level(score: torch.Tensor, tag: str, result: dict) -> None:
    result[f"{tag}_distinct_values_row0"] = int(score[0].unique().numel())
    result[f"{tag}_old_ms"] = median_ms(lambda: reference.indexer_topk_ref(score, TOPK))
    result[f"{tag}_new_ms"] = median_ms(lambda: api.topk_of_scores(score, TOPK))
    result[f"{tag}_equal"] = torch.equal(api.topk_of_scores(score, TOPK), reference.indexer_topk_ref(score, TOPK))


DECODE_BATCHES = [8, 32, 64, 128, 256]
DECODE_CHUNKS = [2, 4, 8, 16]


def decode_sweep(score: torch.Tensor, chunk_counts: list[int]) -> list[dict]:
    rows = []
    for batch in DECODE_BATCHES:
        s = score[-batch:].contiguous()
        want = reference.indexer_topk_ref(s, TOPK)
        out = torch.empty((batch, TOPK), dtype=torch.int32, device=s.device)
        api._launch_select(s, N_KEYS, TOPK, -1, out, 1)
        row = {"batch": batch, "n_keys": N_KEYS, "one_program_per_query_ms": bench_graph(
            lambda: api._launch_select(s, N_KEYS, TOPK, -1, out, 1)), "one_program_equal": torch.equal(out, want),
            "routed_chunks": api._topk_chunks(batch, N_KEYS, TOPK, api._num_sms(s.device)),
            "routed_ms": bench_graph(lambda: api.topk_of_scores(s, TOPK)),
            "routed_equal": torch.equal(api.topk_of_scores(s, TOPK), want)}
        append_slots, api.TOPK_APPEND_SLOTS_PER_K = api.TOPK_APPEND_SLOTS_PER_K, 0  # session 35's append off
        row["one_program_selection_pass_ms"] = bench_graph(lambda: api._launch_select(s, N_KEYS, TOPK, -1, out, 1))
        row["one_program_selection_pass_equal"] = torch.equal(out, want)
        api.TOPK_APPEND_SLOTS_PER_K = append_slots
        for chunks in chunk_counts:
            row[f"chunks{chunks}_ms"] = bench_graph(lambda: api._chunked_topk(s, TOPK, chunks))
            row[f"chunks{chunks}_equal"] = torch.equal(api._chunked_topk(s, TOPK, chunks), want)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_topk.json"))
    args = parser.parse_args()
    dev = torch.device("cuda")
    result = {
        **environment(dev),
        "shape": {"s_q": S_Q, "n_keys": N_KEYS, "topk": TOPK, "block": BLOCK, "n_blocks": N_KEYS // BLOCK,
                  "topk_blocks": TOPK_BLOCKS, "context": CONTEXT, "ratio": RATIO},
        "timing": f"median of {REPS} CUDA-event timings of one call after {WARMUP} warm-up calls",
        "kernel_defaults": {"block": api.TOPK_BLOCK, "num_warps": api.TOPK_NUM_WARPS,
                            "resident_block": api.TOPK_RESIDENT_BLOCK,
                            "resident_max_pairs": api.TOPK_RESIDENT_MAX_PAIRS,
                            "resident_num_warps": api.TOPK_RESIDENT_NUM_WARPS,
                            "append_slots_per_k": api.TOPK_APPEND_SLOTS_PER_K},
    }
    parts = os.environ.get("BENCH_TOPK_PARTS", "levels,blocks,sweep,decode,chunks,indexer").split(",")
    result["parts"] = parts
    q, w, cache, visible, rows = indexer_prefill_case(dev)
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows)  # fp32 [4096, 65536], 1 GiB

    if "levels" in parts:
        bench_topk_level(score, "topk", result)
        result["topk_peer_torch_topk_values_fp32_ms"] = median_ms(
            lambda: torch.topk(score, TOPK, sorted=False).values)
        few = (score * (4.0 / torch.nan_to_num(score, neginf=0.0).abs().amax())).round()  # a few values per row
        bench_topk_level(few, "topk_few_values", result)
        del few
    if "blocks" in parts:
        bench_blocks(score, result)
    if "sweep" in parts:
        result["kernel_step_sweep"] = step_sweep(score)
    if "decode" in parts:
        result["decode"] = decode_sweep(score, DECODE_CHUNKS if "chunks" in parts else [])
    if "indexer" in parts:
        result["scores_ms"] = median_ms(lambda: mini_flashmla.indexer_scores(q, w, cache, visible, rows))
        result["indexer_topk_chunked_ms"] = median_ms(
            lambda: mini_flashmla.indexer_topk(q, w, cache, visible, rows, TOPK))
    result["peak_memory_gb"] = torch.cuda.max_memory_allocated(dev) / 2**30
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_summary(result)


def bench_blocks(score: torch.Tensor, result: dict) -> None:
    compress_len = N_KEYS
    result["blocks_old_ms"] = median_ms(lambda: reference.candidate_blocks_ref(score, compress_len, BLOCK,
                                                                               TOPK_BLOCKS))
    result["blocks_new_ms"] = median_ms(lambda: api.candidate_blocks_of_scores(score, compress_len, BLOCK,
                                                                               TOPK_BLOCKS))
    result["blocks_equal"] = torch.equal(api.candidate_blocks_of_scores(score, compress_len, BLOCK, TOPK_BLOCKS),
                                         reference.candidate_blocks_ref(score, compress_len, BLOCK, TOPK_BLOCKS))


def step_sweep(score: torch.Tensor) -> dict:
    """The kernel's loop step and warps (RESIDENT_SWEEP, STEP_SWEEP), each result checked equal to the default's."""
    compress_len = N_KEYS
    sweep = {}
    out_topk = torch.empty((S_Q, TOPK), dtype=torch.int32, device=score.device)
    out_blocks = torch.empty((S_Q, TOPK_BLOCKS), dtype=torch.int32, device=score.device)
    n_blocks = N_KEYS // BLOCK
    want_topk = api.topk_of_scores(score, TOPK)
    want_blocks = api.candidate_blocks_of_scores(score, compress_len, BLOCK, TOPK_BLOCKS)
    append_slots = api.TOPK_APPEND_SLOTS_PER_K
    for step, warps, append in RESIDENT_SWEEP:
        def topk_resident():
            api._launch_select(score, N_KEYS, TOPK, -1, out_topk, 1, step, warps, resident=True)

        api.TOPK_APPEND_SLOTS_PER_K = append_slots if append else 0
        topk_resident()
        name = f"resident_step{step}_warps{warps}" + ("" if append else "_selection_pass")
        sweep[name] = {"topk_ms": median_ms(topk_resident), "equal": torch.equal(out_topk, want_topk)}
    api.TOPK_APPEND_SLOTS_PER_K = append_slots
    for step, warps in STEP_SWEEP:  # the streaming kernel: two histogram passes and the selection
        def topk():
            api._launch_select(score, N_KEYS, TOPK, -1, out_topk, 1, step, warps, resident=False)

        def blocks():
            api._launch_select(score, n_blocks, TOPK_BLOCKS, n_blocks - 1, out_blocks, BLOCK, step, warps)

        topk()
        blocks()
        sweep[f"step{step}_warps{warps}"] = {
            "topk_ms": median_ms(topk), "blocks_ms": median_ms(blocks),
            "equal": torch.equal(out_topk, want_topk) and torch.equal(out_blocks, want_blocks),
        }
    return sweep


def print_summary(r: dict) -> None:
    print(f"{r['gpu']} torch {r['torch']} triton {r['triton']} {r['date_utc']}")
    for tag, what in (("topk", "top-512 of 65,536 x 4,096, indexer scores"),
                      ("topk_few_values", "top-512, few distinct values"),
                      ("blocks", "top-2,048 of 8,192 blocks x 4,096")):
        if f"{tag}_new_ms" in r:
            print(f"{what}: old {r[f'{tag}_old_ms']:.3f} ms, new {r[f'{tag}_new_ms']:.3f} ms "
                  f"({r[f'{tag}_old_ms'] / r[f'{tag}_new_ms']:.1f}x), bit-identical {r[f'{tag}_equal']}")
    if "topk_peer_torch_topk_values_fp32_ms" in r:
        print(f"peer torch.topk fp32 values only: {r['topk_peer_torch_topk_values_fp32_ms']:.3f} ms")
    for name, t in r.get("kernel_step_sweep", {}).items():
        blocks = f", blocks {t['blocks_ms']:.3f} ms" if "blocks_ms" in t else ""
        print(f"  {name}: topk {t['topk_ms']:.3f} ms{blocks}, equal {t['equal']}")
    if "decode" in r:
        chunk_counts = [c for c in DECODE_CHUNKS if f"chunks{c}_ms" in r["decode"][0]]
        print("| queries | one program per query ms | the same, selection pass ms | "
              + "".join(f"{c} chunks ms | " for c in chunk_counts) + "routed (chunks) ms | all equal |")
        for d in r["decode"]:
            equal = d["one_program_equal"] and d["routed_equal"] and d["one_program_selection_pass_equal"]
            equal = equal and all(d[f"chunks{c}_equal"] for c in chunk_counts)
            print(f"| {d['batch']} | {d['one_program_per_query_ms']:.4f} | {d['one_program_selection_pass_ms']:.4f} | "
                  + "".join(f"{d[f'chunks{c}_ms']:.4f} | " for c in chunk_counts)
                  + f"{d['routed_ms']:.4f} ({d['routed_chunks']}) | {equal} |")
    if "scores_ms" in r:
        print(f"scores {r['scores_ms']:.3f} ms; scores + top-k chunked {r['indexer_topk_chunked_ms']:.3f} ms")
    print(f"peak {r['peak_memory_gb']:.1f} GiB")


if __name__ == "__main__":
    main()
