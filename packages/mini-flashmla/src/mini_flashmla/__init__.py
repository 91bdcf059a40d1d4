"""mini-flashmla: sparse MLA attention with sink over V4.1's paged quantized cache, and the indexer (SM90: Triton, and
Gluon for the attention's 64-head calls; pure-torch references on CPU). See `mini_flashmla.api` for the
contracts."""

from mini_flashmla.api import (
    candidate_blocks,
    candidate_blocks_of_scores,
    candidate_positions,
    indexer_scores,
    indexer_topk,
    key_range_rows,
    sparse_mla_fwd,
    sparse_mla_fwd_paged,
    topk_of_scores,
)

__all__ = [
    "candidate_blocks",
    "candidate_blocks_of_scores",
    "candidate_positions",
    "indexer_scores",
    "indexer_topk",
    "key_range_rows",
    "sparse_mla_fwd",
    "sparse_mla_fwd_paged",
    "topk_of_scores",
]
