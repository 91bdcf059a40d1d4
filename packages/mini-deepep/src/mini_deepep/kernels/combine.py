"""Combine kernel: each expert rank reduces the k rows of a received token to one bf16 partial and
stores it into the token's home rank; the home rank adds the partials of all ranks.

Arithmetic (the documented combine semantics): partial = bf16(fp32 sum over this rank's k, in k
order, of w * y); out = bf16(fp32 sum of the partials in rank order). Whole rows are handled at
once (ROW_BLOCK = hidden rounded up to a power of two) so every program keeps a row in flight.

One kernel, two roles (grid = senders + reducers), overlapping like dispatch:
- senders compute the partials of the peers' tokens, slot chunk by slot chunk, store them into the
  home rank and raise that chunk's flag there;
- reducers walk this rank's own tokens in chunks: they compute the own-experts partial straight from
  y (no round trip through the buffer), wait for the (at most two) slot chunks of each peer that
  the token chunk needs, and add everything in rank order.
"""

import triton
import triton.language as tl

from mini_deepep.kernels.dispatch import NO_SLOT
from mini_deepep.kernels.signals import peer_offset, release_add, release_epoch, wait_at_least


@triton.jit
def _weighted_partial(y, row_weights, pair_rows, TOPK: tl.constexpr, HIDDEN: tl.constexpr, ROW_BLOCK: tl.constexpr):
    """fp32 [ROW_BLOCK]: sum over k in order of w * y of the token's pairs (pair_rows -> int32 [TOPK], -1 = none)."""
    cols = tl.arange(0, ROW_BLOCK)
    acc = tl.zeros([ROW_BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOPK):
        p = tl.load(pair_rows + k).to(tl.int64)
        here = p >= 0
        w = tl.load(row_weights + p, mask=here, other=0.0)
        rows = tl.load(y + p * HIDDEN + cols, mask=(cols < HIDDEN) & here, other=0.0)
        acc += w * rows.to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["num_tokens", "epoch", "consumed_target"])  # change every call: compile once
def combine_kernel(
    buf16, buf64, peer_offsets,  # own symmetric buffer as bf16 / int64, peer offsets in int32 words
    y, row_weights, positions, recv_tokens,  # bf16 [M, HIDDEN], fp32 [M], int32 [R * slots, TOPK], int32 [R]
    send_slot, out,  # int32 [T, R] (slot of each own token on each rank, -1 = not sent), bf16 [T, HIDDEN]
    num_tokens, slots, rank, epoch, consumed_target, timeout_ns,
    combine_offset, flags_offset, consumed_offset, error_offset,
    NUM_SENDERS: tl.constexpr, NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, HIDDEN: tl.constexpr,
    ROW_BLOCK: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, ROW_BLOCK)
    in_row = cols < HIDDEN
    if pid < NUM_SENDERS:
        if NUM_RANKS > 1:
            # Every home rank must have finished reading the previous combine's partials.
            for d in tl.static_range(NUM_RANKS):
                if d != rank:
                    wait_at_least(buf64 + consumed_offset + d, consumed_target, buf64, peer_offsets, error_offset,
                                  timeout_ns, NUM_RANKS)
            most_chunks = 0
            for j in tl.static_range(1, NUM_RANKS):
                most_chunks = tl.maximum(most_chunks, tl.cdiv(tl.load(recv_tokens + (rank + j) % NUM_RANKS), CHUNK))
            for item in range(pid, most_chunks * (NUM_RANKS - 1), NUM_SENDERS):
                c = item // (NUM_RANKS - 1)
                home = (rank + 1 + item % (NUM_RANKS - 1)) % NUM_RANKS
                used = tl.load(recv_tokens + home)
                if c * CHUNK < used:
                    peer = peer_offset(peer_offsets, home)
                    # Every used slot sends a partial, even when a caller's fixed row count dropped all its
                    # pairs (then zeros): the home rank adds one partial per rank its token went to.
                    for slot in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, used)):
                        acc = _weighted_partial(y, row_weights, positions + (home * slots + slot).to(tl.int64) * TOPK,
                                                TOPK, HIDDEN, ROW_BLOCK)
                        dst = buf16 + 2 * peer + combine_offset + (rank * slots + slot).to(tl.int64) * HIDDEN
                        tl.store(dst + cols, acc.to(tl.bfloat16), mask=in_row)
                    release_epoch(buf64 + (peer >> 1) + flags_offset + rank * MAX_CHUNKS + c, epoch)
    else:
        reducer = pid - NUM_SENDERS
        num_reducers = tl.num_programs(0) - NUM_SENDERS
        for c in range(reducer, tl.cdiv(num_tokens, CHUNK), num_reducers):
            t = c * CHUNK + tl.arange(0, CHUNK)
            # The token chunk's slots on a peer are consecutive (at most CHUNK of them): two slot chunks at most.
            for j in tl.static_range(1, NUM_RANKS):
                expert_rank = (rank + j) % NUM_RANKS
                chunk_slots = tl.load(send_slot + t.to(tl.int64) * NUM_RANKS + expert_rank, mask=t < num_tokens, other=-1)
                last = tl.max(chunk_slots, axis=0)
                if last >= 0:
                    first = tl.min(tl.where(chunk_slots >= 0, chunk_slots, NO_SLOT), axis=0)
                    flags = buf64 + flags_offset + expert_rank * MAX_CHUNKS
                    wait_at_least(flags + first // CHUNK, epoch, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
                    wait_at_least(flags + last // CHUNK, epoch, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
            for i in range(CHUNK):
                t64 = tl.cast(c * CHUNK + i, tl.int64)
                if t64 < num_tokens:
                    acc = tl.zeros([ROW_BLOCK], dtype=tl.float32)
                    for d in tl.static_range(NUM_RANKS):
                        slot = tl.load(send_slot + t64 * NUM_RANKS + d)
                        entry = (d * slots + slot).to(tl.int64)
                        if slot >= 0:
                            if d == rank:  # this rank's own experts: the partial straight from y
                                partial = _weighted_partial(y, row_weights, positions + entry * TOPK, TOPK, HIDDEN,
                                                            ROW_BLOCK).to(tl.bfloat16)
                            else:
                                partial = tl.load(buf16 + combine_offset + entry * HIDDEN + cols, mask=in_row, other=0.0)
                            acc += partial.to(tl.float32)
                    tl.store(out + t64 * HIDDEN + cols, acc.to(tl.bfloat16), mask=in_row)
        # This program is done with the partials: every expert rank may overwrite them again.
        for j in tl.static_range(1, NUM_RANKS):
            release_add(buf64 + (peer_offset(peer_offsets, (rank + j) % NUM_RANKS) >> 1) + consumed_offset + rank)
