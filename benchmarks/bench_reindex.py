"""A REINDEX layer's selection at the prefill shape: scoring every key under the candidate mask (sessions 1-28)
against scoring only the candidate blocks' keys (session 29), same run, same data.

Shape (V4.1-Flash layers 24 / 28 / 32 / 36 at bench_prefill's step): 4,096 queries at the end of a 131,072-token
context, ratio 1, so 131,072 index keys (FP4, 68 B rows) in one sequence's contiguous rows; 32 heads x 128; the
candidate source (layer 20) keeps 2,048 blocks of 8 per query, 16,384 keys; top-512.
- candidate source: its dense scores and `candidate_blocks_of_scores` (unchanged; for scale).
- old: `indexer_scores` over all 131,072 keys, `torch.where` with the bool candidate mask, `topk_of_scores`.
- new: `indexer_scores(..., candidate_blocks=)` over the 16,384 candidate keys, `topk_of_scores`,
  `candidate_positions`.
Each part is timed alone and the whole path end to end (triton.testing.do_bench median, L2 not flushed). The two
paths' positions are checked equal tie-aware: the dense scores of the keys each picks, sorted, must be identical
(the two score kernels may differ by one bf16 ulp on rare keys, which can swap keys at a tie). Peer: cuBLAS FP8
per-tensor scaled_mm of the dense GEMM [4096 * 32, 128] x [128, 131072] with a bf16 output.

Usage: python3 benchmarks/bench_reindex.py (JSON to $OUT/bench_reindex.json or ./bench_reindex.json).
"""

from __future__ import annotations

import json
import os

import torch
from bench_flashmla import bench, environment
from mini_deepgemm.reference import fp4_fakequant

import mini_flashmla
from mini_flashmla.cache_layout import pack_index_k_fp4

S_Q, CONTEXT, HEADS, DIM = 4096, 131072, 32, 128
BLOCK, TOPK_BLOCKS, TOPK = 8, 2048, 512


def queries(g: torch.Generator, dev) -> tuple[torch.Tensor, torch.Tensor]:
    q = fp4_fakequant(torch.randn(S_Q, HEADS, DIM, device=dev, generator=g), 32, "ue8m0").bfloat16()
    return q, (torch.randn(S_Q, HEADS, device=dev, generator=g) * 0.02).bfloat16()


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(29)
    cache = pack_index_k_fp4(torch.randn(CONTEXT, DIM, device=dev, generator=g))
    rows = mini_flashmla.key_range_rows(0, CONTEXT, dev)
    visible = torch.arange(CONTEXT - S_Q, CONTEXT, device=dev) + 1  # ratio 1: query at position p sees p + 1 keys
    q_src, w_src = queries(g, dev)
    q, w = queries(g, dev)
    result = {**environment(dev), "shape": {"s_q": S_Q, "n_keys": CONTEXT, "heads": HEADS, "dim": DIM,
                                            "block": BLOCK, "topk_blocks": TOPK_BLOCKS, "topk": TOPK}}

    def source():
        score = mini_flashmla.indexer_scores(q_src, w_src, cache, visible, rows)
        return mini_flashmla.candidate_blocks_of_scores(score, CONTEXT, BLOCK, TOPK_BLOCKS)

    blocks = source()
    result["source_scores_plus_blocks_ms"] = bench(source)
    mask = torch.zeros(S_Q, CONTEXT + BLOCK, dtype=torch.bool, device=dev)  # the model's form; past the end: -1
    entries = blocks.long()[:, :, None] * BLOCK + torch.arange(BLOCK, device=dev)
    mask.scatter_(1, torch.where(blocks[:, :, None] >= 0, entries, CONTEXT).flatten(1), True)
    mask = mask[:, :CONTEXT]

    def old_scores():
        return mini_flashmla.indexer_scores(q, w, cache, visible, rows)

    dense = old_scores()
    masked = torch.where(mask, dense, float("-inf"))

    def old():
        s = old_scores()
        return mini_flashmla.topk_of_scores(torch.where(mask, s, float("-inf")), TOPK)

    def new_scores():
        return mini_flashmla.indexer_scores(q, w, cache, visible, rows, blocks, BLOCK)

    sparse = new_scores()

    def new():
        picked = mini_flashmla.topk_of_scores(new_scores(), TOPK)
        return mini_flashmla.candidate_positions(picked, blocks, BLOCK)

    picked = mini_flashmla.topk_of_scores(sparse, TOPK)
    result.update({
        "old_scores_ms": bench(old_scores),
        "old_mask_where_ms": bench(lambda: torch.where(mask, dense, float("-inf"))),
        "old_topk_ms": bench(lambda: mini_flashmla.topk_of_scores(masked, TOPK)),
        "old_total_ms": bench(old),
        "new_scores_ms": bench(new_scores),
        "new_topk_ms": bench(lambda: mini_flashmla.topk_of_scores(sparse, TOPK)),
        "new_positions_ms": bench(lambda: mini_flashmla.candidate_positions(picked, blocks, BLOCK)),
        "new_total_ms": bench(new),
    })
    result["peer_fp8_scaled_mm_dense_ms"] = dense_peer_ms(dev)

    got, want = new(), old()
    result["rows_identical"] = int((got == want).all(1).sum())

    def picked_values(pos):  # dense scores of the picked keys, sorted; -1 as -inf
        v = dense.gather(1, pos.long().clamp_min(0)).masked_fill(pos < 0, float("-inf"))
        return v.sort(1).values

    result["tie_aware_equal"] = bool(torch.equal(picked_values(got), picked_values(want)))
    dense_flop = 2 * S_Q * HEADS * DIM * CONTEXT
    result["dense_tflop"] = dense_flop / 1e12
    result["candidate_tflop"] = dense_flop * BLOCK * TOPK_BLOCKS / CONTEXT / 1e12
    result["peak_memory_gb"] = torch.cuda.max_memory_allocated(dev) / 2**30
    with open(os.path.join(os.environ.get("OUT", "."), "bench_reindex.json"), "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)


def dense_peer_ms(dev) -> float:
    """cuBLAS FP8 per-tensor scaled_mm of the dense scores' GEMM, [S_Q * HEADS, DIM] x [DIM, CONTEXT] -> bf16."""
    a = torch.empty(S_Q * HEADS, DIM, device=dev).uniform_(-2, 2).to(torch.float8_e4m3fn)
    b = torch.empty(CONTEXT, DIM, device=dev).uniform_(-2, 2).to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    return bench(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def print_table(r: dict) -> None:
    print(f"{r['gpu']} torch {r['torch']} triton {r['triton']} {r['date_utc']}; {S_Q} queries x {CONTEXT} keys, "
          f"{TOPK_BLOCKS} blocks of {BLOCK} candidates, top-{TOPK}")
    print(f"candidate source (dense scores + blocks, unchanged): {r['source_scores_plus_blocks_ms']:.3f} ms; "
          f"peer FP8 scaled_mm of the dense GEMM {r['peer_fp8_scaled_mm_dense_ms']:.3f} ms")
    print("| REINDEX selection | scores ms | mask ms | top-k ms | positions ms | end to end ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| every key, masked (old) | {r['old_scores_ms']:.3f} | {r['old_mask_where_ms']:.3f} "
          f"| {r['old_topk_ms']:.3f} | | {r['old_total_ms']:.3f} |")
    print(f"| candidate keys only (new) | {r['new_scores_ms']:.3f} | | {r['new_topk_ms']:.3f} | "
          f"{r['new_positions_ms']:.3f} | {r['new_total_ms']:.3f} |")
    print(f"speed-up {r['old_total_ms'] / r['new_total_ms']:.2f}x end to end; rows identical "
          f"{r['rows_identical']} of {S_Q}, tie-aware equal {r['tie_aware_equal']}; peak {r['peak_memory_gb']:.1f} GiB")


if __name__ == "__main__":
    main()
