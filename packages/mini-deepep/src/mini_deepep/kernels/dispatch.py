"""Dispatch kernels: store each token once into every destination's receive slots; on arrival,
plan the expert segments from the senders' counts and expand the slots into the grouped layout.

Rows move as int32 words (bf16 x, or FP8 x followed by its UE8M0 scales), so one kernel serves
every payload. A whole row is loaded at once (one block of ROW_BLOCK words) so that every program
keeps a full row in flight; send and expand are persistent (programs stride over the rows).

Where a pair lands needs no sort: the sender ships, with each (token, k), the token's rank among
its own tokens that picked the same expert, plus its per-expert counts; the receiver turns the
count matrix [source, expert] into segment bases, and row = base[source, expert] + rank. So rows
are ordered by expert, then source rank, then source token, exactly as the torch backend's.
"""

import triton
import triton.language as tl

from mini_deepep.kernels.signals import peer_offset, release_add, wait_at_least


@triton.jit
def _pick(vector, lanes, index):
    """vector[index] as a scalar (index is a compile-time lane)."""
    return tl.sum(tl.where(lanes == index, vector, 0), axis=0)


@triton.jit(do_not_specialize=["num_tokens", "consumed_target"])  # change every call: compile once
def dispatch_send_kernel(
    buf32, buf64, peer_offsets,  # own symmetric buffer as int32 / int64, peer offsets in int32 words
    x_a, x_b,  # payload words: int32 [T, A_WORDS] and [T, B_WORDS] (B_WORDS = 0: x_b unused)
    topk_idx, topk_weights, send_slot, rank_in_expert,  # int64 [T, K], fp32 [T, K], int32 [T, R], int32 [T, K]
    tokens_per_rank, tokens_per_expert,  # int32 [R], int32 [R * EXPERTS_PER_RANK]
    num_tokens, rank, consumed_target, timeout_ns,
    data_offset, meta_offset, slots, expert_counts_offset,  # int32-word offsets, slots per source
    arrived_offset, consumed_offset, count_offset, error_offset,  # int64-word offsets of header arrays
    NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr, EXPERT_BLOCK: tl.constexpr,
    MAX_LOCAL_EXPERTS: tl.constexpr, A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, ROW_BLOCK: tl.constexpr,
    B_BLOCK: tl.constexpr, META_WORDS: tl.constexpr, META_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    row_words = A_WORDS + B_WORDS
    # The slots on every destination must be free: its expand kernel of the previous call is done.
    for d in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + consumed_offset + d, consumed_target, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)

    cols = tl.arange(0, ROW_BLOCK)
    b_cols = tl.arange(0, B_BLOCK)
    j = tl.arange(0, META_BLOCK)
    k_of_id = tl.minimum(tl.maximum(j - 1, 0), TOPK - 1)
    k_of_weight = tl.minimum(tl.maximum(j - 1 - TOPK, 0), TOPK - 1)
    k_of_rank = tl.minimum(tl.maximum(j - 1 - 2 * TOPK, 0), TOPK - 1)
    for t in range(pid, num_tokens, num_programs):
        t64 = tl.cast(t, tl.int64)
        words = tl.load(x_a + t64 * A_WORDS + cols, mask=cols < A_WORDS)
        if B_WORDS > 0:
            b_words = tl.load(x_b + t64 * B_WORDS + b_cols, mask=b_cols < B_WORDS)
        expert = tl.load(topk_idx + t64 * TOPK + k_of_id)
        weight_bits = tl.load(topk_weights + t64 * TOPK + k_of_weight).to(tl.int32, bitcast=True)
        rank_bits = tl.load(rank_in_expert + t64 * TOPK + k_of_rank)
        for d in tl.static_range(NUM_RANKS):
            slot = tl.load(send_slot + t64 * NUM_RANKS + d)
            if slot >= 0:
                row = (rank * slots + slot).to(tl.int64)
                dst = buf32 + peer_offset(peer_offsets, d)
                tl.store(dst + data_offset + row * row_words + cols, words, mask=cols < A_WORDS)
                if B_WORDS > 0:
                    tl.store(dst + data_offset + row * row_words + A_WORDS + b_cols, b_words, mask=b_cols < B_WORDS)
                local = expert - d * EXPERTS_PER_RANK
                local = tl.where((expert >= 0) & (local >= 0) & (local < EXPERTS_PER_RANK), local, -1).to(tl.int32)
                meta = tl.where(j == 0, t, tl.where(j <= TOPK, local, tl.where(j <= 2 * TOPK, weight_bits, rank_bits)))
                tl.store(dst + meta_offset + row * META_WORDS + j, meta, mask=j < META_WORDS)

    if pid == 0:
        e = tl.arange(0, EXPERT_BLOCK)
        for d in tl.static_range(NUM_RANKS):
            peer = peer_offset(peer_offsets, d)
            counts = tl.load(tokens_per_expert + d * EXPERTS_PER_RANK + e, mask=e < EXPERTS_PER_RANK)
            tl.store(buf32 + peer + expert_counts_offset + rank * MAX_LOCAL_EXPERTS + e, counts, mask=e < EXPERTS_PER_RANK)
            tl.store(buf64 + (peer >> 1) + count_offset + rank, tl.load(tokens_per_rank + d).to(tl.int64))
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + arrived_offset + rank)


@triton.jit(do_not_specialize=["arrived_target"])
def dispatch_plan_kernel(
    buf32, buf64, peer_offsets, segment_base, tokens_per_local_expert, total_rows,  # out: int32 [R, E_l], [E_l], [1]
    arrived_target, timeout_ns, expert_counts_offset, arrived_offset, error_offset, m_alignment,
    NUM_RANKS: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr, EXPERT_BLOCK: tl.constexpr,
    MAX_LOCAL_EXPERTS: tl.constexpr,
):
    """One program: wait for every source, then segment_base[s, e] = first row of source s in expert e."""
    for s in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + arrived_offset + s, arrived_target, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
    e = tl.arange(0, EXPERT_BLOCK)
    in_range = e < EXPERTS_PER_RANK
    total = tl.zeros([EXPERT_BLOCK], dtype=tl.int32)
    for s in tl.static_range(NUM_RANKS):
        total += tl.load(buf32 + expert_counts_offset + s * MAX_LOCAL_EXPERTS + e, mask=in_range, other=0)
    aligned = (total + m_alignment - 1) // m_alignment * m_alignment
    base = tl.cumsum(aligned, axis=0) - aligned  # each expert's segment start
    tl.store(tokens_per_local_expert + e, total, mask=in_range)
    tl.store(total_rows, tl.sum(aligned, axis=0))
    for s in tl.static_range(NUM_RANKS):
        tl.store(segment_base + s * EXPERTS_PER_RANK + e, base, mask=in_range)
        base += tl.load(buf32 + expert_counts_offset + s * MAX_LOCAL_EXPERTS + e, mask=in_range, other=0)


@triton.jit(do_not_specialize=["num_rows"])
def dispatch_expand_kernel(
    buf32, buf64, peer_offsets, segment_base,
    out_a, out_b, grouped_layout, row_weights,  # int32 [M, A_WORDS], [M, B_WORDS], int32 [M] (-1 filled), fp32 [M]
    positions, recv_src_rank, recv_src_token,  # int32 [R * slots, TOPK], [R * slots], [R * slots]
    num_rows, slots, rank, data_offset, meta_offset, count_offset, consumed_offset,
    NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr,
    A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, ROW_BLOCK: tl.constexpr, B_BLOCK: tl.constexpr,
    META_WORDS: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    row_words = A_WORDS + B_WORDS
    ks = tl.arange(0, TOPK_BLOCK)
    cols = tl.arange(0, ROW_BLOCK)
    b_cols = tl.arange(0, B_BLOCK)
    for slot in range(pid, NUM_RANKS * slots, num_programs):
        slot64 = tl.cast(slot, tl.int64)
        source = slot // slots
        used = (slot % slots) < tl.load(buf64 + count_offset + source)
        meta = buf32 + meta_offset + slot64 * META_WORDS
        local = tl.load(meta + 1 + ks, mask=used & (ks < TOPK), other=-1)
        weight = tl.load(meta + 1 + TOPK + ks, mask=ks < TOPK, other=0).to(tl.float32, bitcast=True)
        rank_in_expert = tl.load(meta + 1 + 2 * TOPK + ks, mask=ks < TOPK, other=0)
        base = tl.load(segment_base + source * EXPERTS_PER_RANK + local, mask=local >= 0, other=0)
        pos = tl.where(local >= 0, base + rank_in_expert, -1)
        pos = tl.where(pos < num_rows, pos, -1)  # a caller's fixed row count may drop pairs
        here = pos >= 0
        tl.store(positions + slot64 * TOPK + ks, pos, mask=ks < TOPK)
        tl.store(recv_src_rank + slot64, tl.where(used, source, -1))
        tl.store(recv_src_token + slot64, tl.where(used, tl.load(meta, mask=used, other=-1), -1))
        tl.store(grouped_layout + pos, local, mask=here)
        tl.store(row_weights + pos, weight, mask=here)
        if tl.max(pos, axis=0) >= 0:
            src = buf32 + data_offset + slot64 * row_words
            words = tl.load(src + cols, mask=cols < A_WORDS)
            if B_WORDS > 0:
                b_words = tl.load(src + A_WORDS + b_cols, mask=b_cols < B_WORDS)
            for k in tl.static_range(TOPK):
                p = _pick(pos, ks, k).to(tl.int64)
                if p >= 0:
                    tl.store(out_a + p * A_WORDS + cols, words, mask=cols < A_WORDS)
                    if B_WORDS > 0:
                        tl.store(out_b + p * B_WORDS + b_cols, b_words, mask=b_cols < B_WORDS)
    # This program is done reading the receive area: every source may overwrite its slots again.
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + consumed_offset + rank)
