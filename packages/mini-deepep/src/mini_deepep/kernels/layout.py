"""`get_dispatch_layout` in two Triton launches (the torch path is ~10 small ops, ~0.6 ms of launches on H200).

Tokens are cut into blocks of BLOCK_TOKENS. Every output is a block-local value plus a sum over earlier blocks:
- pass 1 (`layout_block_kernel`, one program per block) writes the block-local values straight into the outputs
  (rank_in_expert among the block's tokens, send_slot among the block's tokens, is_token_in_rank, final) and the
  block's counts into column b of a scratch `counts` int32 [E + R, num_blocks]: row e = tokens of block b that
  picked expert e, row E + r = tokens of block b sent to rank r.
- pass 2 (`layout_offsets_kernel`, one program per block) adds to each (token, k) the sum of counts[e, :b] and to
  each sent (token, r) the sum of counts[E + r, :b]; a few more programs write the totals (full row sums).
Scratch is expert-major so that the sum over earlier blocks reads contiguous runs. Pass 2 reads O(b) columns in
block b, O(num_blocks^2) in all: at T=4096 (128 blocks) the last block reads 4 tiles of [32, K, 32] counts, cheaper
than a third launch that would scan the counts first.
No host synchronisation and fixed shapes: CUDA-graph friendly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_deepep.layout import DispatchLayout, split_experts

# Tokens per program. The within-block rank compares every (token, k) with every earlier token of the block, a
# [BLOCK_TOKENS, K, BLOCK_TOKENS] tile per k' (8K lanes at K <= 8, held in registers by 4 warps).
BLOCK_TOKENS = 32
# Earlier blocks summed per step in pass 2 ([BLOCK_TOKENS, K, PREFIX_BLOCKS] loads).
PREFIX_BLOCKS = 32
# Count rows whose totals one pass-2 program sums ([TOTAL_ROWS, 1, PREFIX_BLOCKS] loads per step).
TOTAL_ROWS = 64
# Expert rows zeroed per step in pass 1.
FILL_ROWS = 128


@triton.jit(do_not_specialize=["num_tokens", "num_blocks"])  # change every call: compile once
def layout_block_kernel(
    topk_idx, stride_t, stride_k,  # int32 or int64 [T, K], any strides
    counts,  # int32 [E + R, num_blocks] scratch, this program writes column program_id
    is_token_in_rank, send_slot, rank_in_expert,  # bool [T, R], int32 [T, R], int32 [T, K], contiguous
    num_tokens, num_blocks, num_experts, experts_per_rank,
    NUM_TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, NUM_RANKS: tl.constexpr, RANKS_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    """Block-local layout of tokens [b * BLOCK_T, (b + 1) * BLOCK_T) and the block's counts (column b)."""
    block = tl.program_id(0)
    local = tl.arange(0, BLOCK_T)
    t = block * BLOCK_T + local
    k = tl.arange(0, TOPK_PAD)
    expert, valid = _load_experts(topk_idx, stride_t, stride_k, t, k, num_tokens, num_experts, NUM_TOPK)

    # hit[t, k, t'] = token t' of the block picked expert[t, k] (an OR over k': a token that lists an expert
    # twice counts once, as in the torch path). Padding tokens and -1 entries load as -1 and never match.
    hit = tl.zeros((BLOCK_T, TOPK_PAD, BLOCK_T), dtype=tl.int1)
    for j in tl.static_range(NUM_TOPK):
        other = tl.load(topk_idx + t * stride_t + j * stride_k, mask=t < num_tokens, other=-1).to(tl.int32)
        hit = hit | (expert[:, :, None] == other[None, None, :])
    hit = hit & valid[:, :, None]
    earlier = tl.sum((hit & (local[None, None, :] < local[:, None, None])).to(tl.int32), axis=2)
    in_block = tl.sum(hit.to(tl.int32), axis=2)
    pair_mask = (t < num_tokens)[:, None] & (k < NUM_TOPK)[None, :]
    tl.store(rank_in_expert + t[:, None] * NUM_TOPK + k[None, :], tl.where(valid, earlier, -1), mask=pair_mask)

    r = tl.arange(0, RANKS_PAD)
    rank = expert // experts_per_rank
    sent = tl.max((valid[:, :, None] & (rank[:, :, None] == r[None, None, :])).to(tl.int32), axis=1)  # [T, R]
    slot = tl.cumsum(sent, axis=0) - sent  # exclusive: sent tokens before t in this block
    rank_mask = (t < num_tokens)[:, None] & (r < NUM_RANKS)[None, :]
    tl.store(is_token_in_rank + t[:, None] * NUM_RANKS + r[None, :], sent != 0, mask=rank_mask)
    tl.store(send_slot + t[:, None] * NUM_RANKS + r[None, :], tl.where(sent != 0, slot, -1), mask=rank_mask)
    tl.store(counts + (num_experts + r) * num_blocks + block, tl.sum(sent, axis=0), mask=r < NUM_RANKS)

    # Expert counts: zero the column, then the block's last token holding each expert writes how many tokens of
    # the block hold it. The barrier orders the zeros before those writes (a row's zero and its count may be stored
    # by different threads).
    for e0 in range(0, num_experts, FILL_BLOCK):
        rows = e0 + tl.arange(0, FILL_BLOCK)
        tl.store(counts + rows * num_blocks + block, tl.zeros((FILL_BLOCK,), dtype=tl.int32), mask=rows < num_experts)
    tl.debug_barrier()
    tl.store(counts + expert * num_blocks + block, in_block, mask=valid & (earlier + 1 == in_block))


@triton.jit(do_not_specialize=["num_tokens", "num_blocks"])
def layout_offsets_kernel(
    topk_idx, stride_t, stride_k,  # int32 or int64 [T, K], any strides
    counts,  # int32 [E + R, num_blocks], written by layout_block_kernel
    send_slot, rank_in_expert,  # int32 [T, R], int32 [T, K]: block-local on entry, final on exit
    num_tokens_per_expert, num_tokens_per_rank,  # int32 [E], int32 [R]
    num_tokens, num_blocks, num_experts,
    NUM_TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, NUM_RANKS: tl.constexpr, RANKS_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, PREFIX_BLOCK: tl.constexpr, TOTAL_BLOCK: tl.constexpr,
):
    """Programs [0, num_blocks): add the earlier blocks' counts to block b's local ranks and slots. Programs past
    those: the totals of TOTAL_BLOCK count rows each (separate programs, so that a small T, with few blocks, does
    not leave all E + R rows to one program)."""
    block = tl.program_id(0)
    if block >= num_blocks:
        num_rows = num_experts + NUM_RANKS
        rows = ((block - num_blocks) * TOTAL_BLOCK + tl.arange(0, TOTAL_BLOCK))[:, None]
        total = _sum_columns(counts, num_blocks, rows, rows < num_rows, num_blocks, PREFIX_BLOCK)
        tl.store(num_tokens_per_expert + rows, total, mask=rows < num_experts)
        tl.store(num_tokens_per_rank + rows - num_experts, total, mask=(rows >= num_experts) & (rows < num_rows))
        return

    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    k = tl.arange(0, TOPK_PAD)
    expert, valid = _load_experts(topk_idx, stride_t, stride_k, t, k, num_tokens, num_experts, NUM_TOPK)
    earlier_blocks = _sum_columns(counts, num_blocks, expert, valid, block, PREFIX_BLOCK)
    pairs = rank_in_expert + t[:, None] * NUM_TOPK + k[None, :]
    tl.store(pairs, tl.load(pairs, mask=valid, other=0) + earlier_blocks, mask=valid)

    r = tl.arange(0, RANKS_PAD)[None, :]
    earlier_blocks = _sum_columns(counts, num_blocks, num_experts + r, r < NUM_RANKS, block, PREFIX_BLOCK)  # [1, R]
    slots = send_slot + t[:, None] * NUM_RANKS + r
    rank_mask = (t < num_tokens)[:, None] & (r < NUM_RANKS)
    slot = tl.load(slots, mask=rank_mask, other=-1)
    tl.store(slots, slot + earlier_blocks, mask=rank_mask & (slot >= 0))


@triton.jit
def _load_experts(topk_idx, stride_t, stride_k, t, k, num_tokens, num_experts, NUM_TOPK: tl.constexpr):
    """int32 expert ids [len(t), len(k)] (-1 outside the tensor) and which are real experts (0 <= id < E)."""
    mask = (t < num_tokens)[:, None] & (k < NUM_TOPK)[None, :]
    expert = tl.load(topk_idx + t[:, None] * stride_t + k[None, :] * stride_k, mask=mask, other=-1).to(tl.int32)
    return expert, (expert >= 0) & (expert < num_experts)


@triton.jit
def _sum_columns(counts, num_blocks, rows, mask, end, PREFIX_BLOCK: tl.constexpr):
    """sum(counts[rows, 0:end]) for a 2-D tensor of row ids (0 where mask is false)."""
    total = tl.zeros(rows.shape, dtype=tl.int32)
    for c0 in range(0, end, PREFIX_BLOCK):
        cols = c0 + tl.arange(0, PREFIX_BLOCK)
        tile = tl.load(counts + rows[:, :, None] * num_blocks + cols[None, None, :],
                       mask=mask[:, :, None] & (cols < end)[None, None, :], other=0)
        total += tl.sum(tile, axis=2)
    return total


def dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> DispatchLayout:
    """`mini_deepep.layout.get_dispatch_layout` on the GPU (same outputs, bit for bit, for valid routings).

    topk_idx: int32 or int64 [num_tokens, num_topk], global expert ids, -1 = none; num_experts % num_ranks == 0.
    Ids outside [0, num_experts) count as none (the torch path raises on them). A token that lists an expert twice
    counts once, as in the torch path. Returns int32 [R], int32 [E], bool [T, R], int32 [T, R], int32 [T, K].
    """
    experts_per_rank = split_experts(num_experts, num_ranks)
    num_tokens, num_topk = topk_idx.shape
    device = topk_idx.device
    is_token_in_rank = torch.empty(num_tokens, num_ranks, dtype=torch.bool, device=device)
    send_slot = torch.empty(num_tokens, num_ranks, dtype=torch.int32, device=device)
    rank_in_expert = torch.empty(num_tokens, num_topk, dtype=torch.int32, device=device)
    if num_tokens == 0:  # no program to launch: the counts are zero
        return DispatchLayout(torch.zeros(num_ranks, dtype=torch.int32, device=device),
                              torch.zeros(num_experts, dtype=torch.int32, device=device),
                              is_token_in_rank, send_slot, rank_in_expert)
    num_tokens_per_rank = torch.empty(num_ranks, dtype=torch.int32, device=device)
    num_tokens_per_expert = torch.empty(num_experts, dtype=torch.int32, device=device)
    num_blocks = triton.cdiv(num_tokens, BLOCK_TOKENS)
    counts = torch.empty(num_experts + num_ranks, num_blocks, dtype=torch.int32, device=device)
    shape = dict(NUM_TOPK=num_topk, TOPK_PAD=triton.next_power_of_2(num_topk), NUM_RANKS=num_ranks,
                 RANKS_PAD=triton.next_power_of_2(num_ranks), BLOCK_T=BLOCK_TOKENS)
    # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
    # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
    layout_block_kernel[(num_blocks,)](
        topk_idx, topk_idx.stride(0), topk_idx.stride(1), counts, is_token_in_rank, send_slot, rank_in_expert,
        num_tokens, num_blocks, num_experts, experts_per_rank, FILL_BLOCK=FILL_ROWS, **shape,
        enable_fp_fusion=True,
    )
    total_programs = triton.cdiv(num_experts + num_ranks, TOTAL_ROWS)
    layout_offsets_kernel[(num_blocks + total_programs,)](
        topk_idx, topk_idx.stride(0), topk_idx.stride(1), counts, send_slot, rank_in_expert,
        num_tokens_per_expert, num_tokens_per_rank, num_tokens, num_blocks, num_experts,
        PREFIX_BLOCK=PREFIX_BLOCKS, TOTAL_BLOCK=TOTAL_ROWS, **shape,
        enable_fp_fusion=True,
    )
    return DispatchLayout(num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank, send_slot, rank_in_expert)
