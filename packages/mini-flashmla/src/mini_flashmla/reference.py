"""Pure-torch references of V4.1's attention-side ops (the oracles; also the CPU path).

V41_MODEL.md 2.4 (indexer scoring, top-k, two-level candidate selection) and 3.4 (sparse attention with sink).
"""

from __future__ import annotations

import torch

from mini_flashmla.cache_layout import unpack_compressed_kv_fp4, unpack_index_k_fp4, unpack_window_fp8

SPARSE_ATTN_BLOCK = 64  # the reference kernel's online-softmax step over indices
NEG_INIT = -1e30  # its initial running max


def sparse_attn_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention over one shared K=V head, with an attention sink in the denominator.

    q: bf16 [s_q, h, d]; kv: bf16 [n_kv, d] (K and V are the same rows); indices: int32 [s_q, topk] rows of kv,
    -1 = empty; attn_sink: fp32 [h] or None. Scores are fp32 from bf16 operands times sm_scale; the softmax runs
    online over blocks of 64 indices (running max starts at -1e30), P is rounded to bf16 before P.V, and
    exp(sink - max) is added to the denominator at the end. A row whose indices are all -1 gives 0 output. An empty
    slot contributes nothing whatever kv holds: a NaN or inf in kv reaches only the queries that select its row.
    Returns (out bf16 [s_q, h, d], lse fp32 [s_q, h]) with lse = max + log(sum exp) over the valid indices
    (without the sink; -inf for an all-empty row).
    """
    s_q, h, d = q.shape
    topk = indices.shape[1]
    valid = indices >= 0
    # an empty slot's row is zeros: its P is 0, and 0 x a NaN or inf in whatever row it read would be NaN
    rows = torch.where(valid[..., None], kv[indices.clamp_min(0).long()], 0)  # [s_q, topk, d]
    scores = torch.einsum("shd,skd->shk", q.float(), rows.float()) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    m = torch.full((s_q, h), NEG_INIT, dtype=torch.float32, device=q.device)
    denom = torch.zeros((s_q, h), dtype=torch.float32, device=q.device)
    acc = torch.zeros((s_q, h, d), dtype=torch.float32, device=q.device)
    for b0 in range(0, topk, SPARSE_ATTN_BLOCK):
        sc = scores[:, :, b0 : b0 + SPARSE_ATTN_BLOCK]
        m_new = torch.maximum(m, sc.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(sc - m_new[..., None])
        denom = denom * alpha + p.sum(-1)
        pv = torch.einsum("shk,skd->shd", p.to(torch.bfloat16).float(), rows[:, b0 : b0 + SPARSE_ATTN_BLOCK].float())
        acc = acc * alpha[..., None] + pv
        m = m_new
    lse = torch.where(denom > 0, m + torch.log(denom), torch.full_like(m, float("-inf")))
    if attn_sink is not None:
        denom = denom + torch.exp(attn_sink.float()[None, :] - m)
    out = torch.where(denom[..., None] > 0, acc / denom[..., None], torch.zeros_like(acc))
    return out.to(torch.bfloat16), lse


def indexer_scores_ref(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Indexer scores with the reference's bf16 rounding points.

    q: bf16 [s_q, h, d] (FP4 fake-quantized, RoPE applied); k: bf16 [n_k, d] (same); weights: bf16 [s_q, h]
    (already scaled by d^-0.5 * h^-0.5); visible: int64 [s_q], query i sees keys t < visible[i].
    score[i, t] = bf16( sum_h bf16( relu(bf16(q_ih . k_t)) * w_ih ) ), -inf where t >= visible[i].
    Returns fp32 [s_q, n_k] (values exactly bf16).
    """
    s = torch.einsum("shd,td->sht", q.float(), k.float()).to(torch.bfloat16)
    prod = (torch.relu(s).float() * weights.float()[:, :, None]).to(torch.bfloat16)
    score = prod.float().sum(1).to(torch.bfloat16).float()
    t = torch.arange(k.shape[0], device=q.device)
    return score.masked_fill(t[None, :] >= visible[:, None], float("-inf"))


def topk_lowest_index(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values of each row of x (fp32 [..., n], -inf allowed, no NaN), equal values ranked
    by ascending index; int64 [..., k] in that order.

    torch.topk leaves the order of ties to the implementation, which picks differently for rows of different
    lengths (and on CPU and CUDA): with a fixed rule a selection depends only on the scores, so a row padded with
    -inf (the engine's fixed-shape decode) selects what the unpadded row does. Each value becomes an int64 key
    (its fp32 bits in an order-preserving form, then the reversed index), all distinct.
    """
    n = x.shape[-1]
    bits = (x.float() + 0.0).contiguous().view(torch.int32).to(torch.int64)  # + 0.0: -0.0 ranks as +0.0
    order = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: flip the magnitude bits
    key = order * (1 << 32) + (n - 1 - torch.arange(n, dtype=torch.int64, device=x.device))
    return key.topk(k, dim=-1).indices


def indexer_topk_ref(score: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-k of the indexer scores, sorted ascending by position, -1 for entries that are not selectable.

    score: fp32 [s_q, n_k] with -inf for invisible / excluded keys. Returns int32 [s_q, min(topk, n_k)]; an entry
    whose score is -inf is -1 (so a query never reads a key it may not see). Ties: the lowest position wins
    (topk_lowest_index).
    """
    k = min(topk, score.shape[1])
    if k == 0:
        return torch.empty((score.shape[0], 0), dtype=torch.int32, device=score.device)
    idx = topk_lowest_index(score, k)
    vals = score.gather(-1, idx)
    idx = torch.where(torch.isneginf(vals), torch.full_like(idx, -1), idx)
    big = score.shape[1]
    idx = torch.where(idx < 0, torch.full_like(idx, big), idx).sort(-1).values
    return torch.where(idx == big, torch.full_like(idx, -1), idx).to(torch.int32)


def _block_values(score: torch.Tensor, compress_len: int, block: int) -> torch.Tensor:
    """fp32 [s_q, n_blocks]: the max of each block of `block` entries (the tail padded with -inf), the block of
    entry compress_len - 1 forced to +inf (none when compress_len is 0)."""
    s_q, n_k = score.shape
    n_blocks = -(-n_k // block)
    padded = torch.nn.functional.pad(score, (0, n_blocks * block - n_k), value=float("-inf"))
    bval = padded.view(s_q, n_blocks, block).amax(-1)
    if compress_len > 0:
        bval[:, (compress_len - 1) // block] = float("inf")
    return bval


def candidate_block_mask_ref(score: torch.Tensor, compress_len: int, block: int, topk_blocks: int) -> torch.Tensor:
    """Two-level selection, first level (candidate source layer): which compressed entries each query may choose.

    score: fp32 [s_q, n_k] indexer scores (-inf where invisible). Entries are grouped in blocks of `block`
    (padded with -inf); a block's value is its max; the block holding the newest entry (compress_len - 1) is forced
    to +inf; the top `topk_blocks` blocks with value > -inf are kept (ties: the lowest block wins). Returns bool
    [s_q, n_k]: the model's form (V41_MODEL.md 2.4), which later layers apply as a -inf mask on their scores.
    """
    s_q, n_k = score.shape
    bval = _block_values(score, compress_len, block)
    n_blocks = bval.shape[1]
    kb = min(topk_blocks, n_blocks)
    bidx = topk_lowest_index(bval, kb)
    vals = bval.gather(-1, bidx)
    keep = torch.zeros((s_q, n_blocks), dtype=torch.bool, device=score.device)
    keep.scatter_(1, bidx, vals > float("-inf"))
    return keep[:, :, None].expand(s_q, n_blocks, block).reshape(s_q, n_blocks * block)[:, :n_k]


def candidate_blocks_ref(score: torch.Tensor, compress_len: int, block: int, topk_blocks: int) -> torch.Tensor:
    """The blocks candidate_block_mask_ref keeps, as ids: int32 [s_q, min(topk_blocks, n_blocks)], ascending, then
    -1 fill. A REINDEX layer scores only these blocks' entries (candidate_entries), which selects what scoring every
    entry under the mask selects, at a fraction of the work (V4.1: 2,048 of 16,384 blocks at 131k context)."""
    bval = _block_values(score, compress_len, block)
    return indexer_topk_ref(bval, topk_blocks)


def candidate_entries(blocks: torch.Tensor, block: int) -> torch.Tensor:
    """Logical entry positions of candidate blocks: int64 [s_q, kb * block], entry b * block + j in column
    i * block + j for blocks[:, i] = b (ascending, since the blocks are), -1 for a -1 block."""
    b = blocks.long()[:, :, None]
    entries = b * block + torch.arange(block, device=blocks.device)
    return torch.where(b >= 0, entries, -1).flatten(1)


# --------------------------------------------------------------------------- over the packed cache
def _unpack_referenced_rows(cache: torch.Tensor, ids: torch.Tensor, unpack) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize only the rows `ids` (int [..., n], -1 = none) refer to. Returns (rows [u, d], ids remapped into
    them, -1 kept)."""
    valid = (ids >= 0) & (ids < cache.shape[0])
    uniq, inverse = torch.unique(torch.where(valid, ids, 0).long(), return_inverse=True)
    return unpack(cache[uniq]), torch.where(valid, inverse, -1)


def sparse_attn_paged_ref(
    q: torch.Tensor,
    window_cache: torch.Tensor,
    compressed_cache: torch.Tensor | None,
    window_ids: torch.Tensor,
    compressed_ids: torch.Tensor | None,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sparse_attn_ref over the quantized paged cache: unpack the referenced rows (cache_layout's unpack), then
    attend over concat(window rows, compressed rows) with the window slots first. window_cache uint8 [*, 528],
    compressed_cache uint8 [*, 288] or None; ids int32 flat rows, -1 = empty (ids outside the cache count as empty)."""
    kv_w, idx_w = _unpack_referenced_rows(window_cache, window_ids, unpack_window_fp8)
    kv, idx = kv_w, idx_w
    if compressed_cache is not None:
        kv_c, idx_c = _unpack_referenced_rows(compressed_cache, compressed_ids, unpack_compressed_kv_fp4)
        kv = torch.cat([kv_w, kv_c])
        idx = torch.cat([idx_w, torch.where(idx_c >= 0, idx_c + kv_w.shape[0], -1)], dim=1)
    return sparse_attn_ref(q, kv, idx.to(torch.int32), sm_scale, attn_sink)


def indexer_scores_paged_ref(
    q: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor, visible: torch.Tensor, key_rows: torch.Tensor
) -> torch.Tensor:
    """indexer_scores_ref with keys read from the packed index-key cache (uint8 [*, 68]) through flat row ids:
    key_rows int [n_keys] shared by all queries, or [s_q, n_keys] per query. Keys whose row is -1 (or outside the
    cache) score -inf. Returns fp32 [s_q, n_keys]."""
    valid = (key_rows >= 0) & (key_rows < index_k_cache.shape[0])
    keys = unpack_index_k_fp4(index_k_cache[torch.where(valid, key_rows, 0).long()])
    if key_rows.dim() == 1:
        score = indexer_scores_ref(q, keys, weights, visible)
    else:  # one key list per query
        score = torch.full(key_rows.shape, float("-inf"), dtype=torch.float32, device=q.device)
        for i in range(q.shape[0]):
            score[i] = indexer_scores_ref(q[i : i + 1], keys[i], weights[i : i + 1], visible[i : i + 1])[0]
    return score.masked_fill(~valid.expand_as(score), float("-inf"))


def indexer_scores_candidates_ref(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    visible: torch.Tensor,
    key_rows: torch.Tensor,
    blocks: torch.Tensor,
    block: int,
) -> torch.Tensor:
    """indexer_scores_paged_ref over each query's candidate entries only: fp32 [s_q, kb * block], column c the score
    of logical entry candidate_entries(blocks, block)[i, c]; -inf for a -1 block, an entry at or past visible[i] or
    past the key list. key_rows as in indexer_scores_paged_ref ([n_keys] shared, or [s_q, n_keys])."""
    entries = candidate_entries(blocks, block)
    n_keys = key_rows.shape[-1]
    if n_keys == 0:
        return torch.full(entries.shape, float("-inf"), dtype=torch.float32, device=q.device)
    ok = (entries >= 0) & (entries < visible[:, None]) & (entries < n_keys)
    per_query = key_rows if key_rows.dim() == 2 else key_rows.expand(entries.shape[0], n_keys)
    rows = torch.where(ok, per_query.gather(1, entries.clamp(0, n_keys - 1)), -1)
    everything = torch.full_like(visible, rows.shape[1])  # visibility is already in the rows
    return indexer_scores_paged_ref(q, weights, index_k_cache, everything, rows)
