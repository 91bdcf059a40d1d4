"""Dispatch kernels: store each token once into every destination's receive slots, then expand
the received slots into the expert-grouped layout.

All rows are moved as int32 words (bf16 x, or FP8 x followed by its UE8M0 scales), so one kernel
serves every payload. Both kernels are persistent: `num_programs` programs stride over the rows.
"""

import triton
import triton.language as tl

from mini_deepep.kernels.signals import peer_offset, release_add, wait_at_least

CHUNK_WORDS = 1024  # 4 KiB of a row per step: 8 words (two 16-byte vectors) per thread at 4 warps


@triton.jit(do_not_specialize=["num_tokens", "epoch"])  # changes every call: compile once
def dispatch_send_kernel(
    buf32, buf64, peer_offsets,  # own symmetric buffer as int32 / int64, peer offsets in int32 words
    x_a, x_b,  # payload words: int32 [T, A_WORDS] and [T, B_WORDS] (B_WORDS = 0: unused)
    topk_idx, topk_weights, send_slot, tokens_per_rank,  # int64 [T, K], fp32 [T, K], int32 [T, R], int32 [R]
    num_tokens, rank, epoch,
    data_offset, meta_offset, slots,  # int32-word offsets of the receive payload / meta, slots per source
    arrived_offset, consumed_offset, count_offset, error_offset,  # int64-word offsets of header arrays
    NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr,
    A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, META_WORDS: tl.constexpr,
    CHUNK: tl.constexpr, B_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    row_words = A_WORDS + B_WORDS
    # The slots on every destination must be free: its expand kernel of the previous call is done.
    for d in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + consumed_offset + d, (epoch - 1) * num_programs, buf64 + error_offset)

    j = tl.arange(0, META_WORDS)
    k_of_id = tl.minimum(tl.maximum(j - 1, 0), TOPK - 1)
    k_of_weight = tl.minimum(tl.maximum(j - 1 - TOPK, 0), TOPK - 1)
    for t in range(pid, num_tokens, num_programs):
        t64 = tl.cast(t, tl.int64)
        # Payload: load each chunk once, store it to every destination that wants the token.
        for c in tl.static_range(0, A_WORDS, CHUNK):
            cols = c + tl.arange(0, CHUNK)
            in_row = cols < A_WORDS
            words = tl.load(x_a + t64 * A_WORDS + cols, mask=in_row)
            for d in tl.static_range(NUM_RANKS):
                slot = tl.load(send_slot + t64 * NUM_RANKS + d)
                dst = buf32 + peer_offset(peer_offsets, d) + data_offset + (rank * slots + slot).to(tl.int64) * row_words
                tl.store(dst + cols, words, mask=in_row & (slot >= 0))
        if B_WORDS > 0:
            cols = tl.arange(0, B_BLOCK)
            in_row = cols < B_WORDS
            words = tl.load(x_b + t64 * B_WORDS + cols, mask=in_row)
            for d in tl.static_range(NUM_RANKS):
                slot = tl.load(send_slot + t64 * NUM_RANKS + d)
                dst = buf32 + peer_offset(peer_offsets, d) + data_offset + (rank * slots + slot).to(tl.int64) * row_words
                tl.store(dst + A_WORDS + cols, words, mask=in_row & (slot >= 0))
        # Meta row: [source token, local expert id per k (-1 if not the destination's), weight bits].
        expert = tl.load(topk_idx + t64 * TOPK + k_of_id)
        weight_bits = tl.load(topk_weights + t64 * TOPK + k_of_weight).to(tl.int32, bitcast=True)
        for d in tl.static_range(NUM_RANKS):
            slot = tl.load(send_slot + t64 * NUM_RANKS + d)
            local = expert - d * EXPERTS_PER_RANK
            local = tl.where((expert >= 0) & (local >= 0) & (local < EXPERTS_PER_RANK), local, -1).to(tl.int32)
            meta = tl.where(j == 0, t, tl.where(j <= TOPK, local, tl.where(j <= 2 * TOPK, weight_bits, 0)))
            dst = buf32 + peer_offset(peer_offsets, d) + meta_offset + (rank * slots + slot).to(tl.int64) * META_WORDS
            tl.store(dst + j, meta, mask=(j < META_WORDS) & (slot >= 0))

    if pid == 0:
        for d in tl.static_range(NUM_RANKS):
            count = tl.load(tokens_per_rank + d).to(tl.int64)
            tl.store(buf64 + (peer_offset(peer_offsets, d) >> 1) + count_offset + rank, count)
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + arrived_offset + rank)


@triton.jit
def dispatch_expand_kernel(
    buf32, buf64, peer_offsets,
    positions,  # int32 [NUM_RANKS * slots, TOPK]: output row of each received (token, k), -1 = none
    out_a, out_b,  # int32 [M, A_WORDS], [M, B_WORDS]
    num_slots, rank, data_offset, consumed_offset,
    NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr,
    A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, CHUNK: tl.constexpr, B_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    row_words = A_WORDS + B_WORDS
    ks = tl.arange(0, TOPK_BLOCK)
    for s in range(pid, num_slots, num_programs):
        s64 = tl.cast(s, tl.int64)
        pos = tl.load(positions + s64 * TOPK + ks, mask=ks < TOPK, other=-1)
        if tl.max(pos, axis=0) >= 0:  # unused slots (past the source's count) have no positions
            src = buf32 + data_offset + s64 * row_words
            for c in tl.static_range(0, A_WORDS, CHUNK):
                cols = c + tl.arange(0, CHUNK)
                in_row = cols < A_WORDS
                words = tl.load(src + cols, mask=in_row)
                for k in tl.static_range(TOPK):
                    p = tl.load(positions + s64 * TOPK + k).to(tl.int64)
                    tl.store(out_a + p * A_WORDS + cols, words, mask=in_row & (p >= 0))
            if B_WORDS > 0:
                cols = tl.arange(0, B_BLOCK)
                in_row = cols < B_WORDS
                words = tl.load(src + A_WORDS + cols, mask=in_row)
                for k in tl.static_range(TOPK):
                    p = tl.load(positions + s64 * TOPK + k).to(tl.int64)
                    tl.store(out_b + p * B_WORDS + cols, words, mask=in_row & (p >= 0))
    # This program is done reading the receive area: every source may overwrite its slots again.
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + consumed_offset + rank)
