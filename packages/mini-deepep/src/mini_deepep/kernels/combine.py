"""Combine kernels: each expert rank reduces the k rows of a received token to one bf16 partial and
stores it into the token's home rank; the home rank adds the partials of all ranks.

Arithmetic (the documented combine semantics): partial = bf16(fp32 sum over this rank's k, in k
order, of w * y); out = bf16(fp32 sum of the partials in rank order). Whole rows are handled at
once (ROW_BLOCK = hidden rounded up to a power of two) so every program keeps a row in flight.
"""

import triton
import triton.language as tl

from mini_deepep.kernels.signals import peer_offset, release_add, wait_at_least


@triton.jit(do_not_specialize=["consumed_target"])  # changes every call: compile once
def combine_send_kernel(
    buf16, buf64, peer_offsets,  # own symmetric buffer as bf16 / int64, peer offsets in int32 words
    y, row_weights, positions, recv_src_rank,  # bf16 [M, HIDDEN], fp32 [M], int32 [NUM_RANKS * slots, TOPK], [NUM_RANKS * slots]
    num_slots, slots, rank, consumed_target, timeout_ns,
    combine_offset, consumed_offset, arrived_offset, error_offset,
    NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, HIDDEN: tl.constexpr, ROW_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    # The home ranks must have finished reading the previous combine's partials.
    for d in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + consumed_offset + d, consumed_target, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
    cols = tl.arange(0, ROW_BLOCK)
    in_row = cols < HIDDEN
    for s in range(pid, num_slots, num_programs):
        s64 = tl.cast(s, tl.int64)
        # Every used slot sends a partial, even when a caller's fixed row count dropped all its pairs
        # (then zeros): the home rank reads one partial per rank its token went to, and would
        # otherwise add a stale one from an earlier combine.
        if tl.load(recv_src_rank + s64) >= 0:
            home = s // slots  # the slot's source rank: where the partial goes back to
            dst = buf16 + 2 * peer_offset(peer_offsets, home) + combine_offset + (rank * slots + s % slots).to(tl.int64) * HIDDEN
            acc = tl.zeros([ROW_BLOCK], dtype=tl.float32)
            for k in tl.static_range(TOPK):
                p = tl.load(positions + s64 * TOPK + k).to(tl.int64)
                here = p >= 0
                w = tl.load(row_weights + p, mask=here, other=0.0)
                rows = tl.load(y + p * HIDDEN + cols, mask=in_row & here, other=0.0)
                acc += w * rows.to(tl.float32)
            tl.store(dst + cols, acc.to(tl.bfloat16), mask=in_row)
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + arrived_offset + rank)


@triton.jit(do_not_specialize=["num_tokens", "arrived_target"])  # change every call: compile once
def combine_reduce_kernel(
    buf16, buf64, peer_offsets,
    send_slot, out,  # int32 [T, NUM_RANKS] (slot of each token on each rank, -1 = not sent), bf16 [T, HIDDEN]
    num_tokens, slots, rank, arrived_target, timeout_ns,
    combine_offset, arrived_offset, consumed_offset, error_offset,
    NUM_RANKS: tl.constexpr, HIDDEN: tl.constexpr, ROW_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    for d in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + arrived_offset + d, arrived_target, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
    cols = tl.arange(0, ROW_BLOCK)
    in_row = cols < HIDDEN
    for t in range(pid, num_tokens, num_programs):
        t64 = tl.cast(t, tl.int64)
        acc = tl.zeros([ROW_BLOCK], dtype=tl.float32)
        for d in tl.static_range(NUM_RANKS):
            slot = tl.load(send_slot + t64 * NUM_RANKS + d)
            src = buf16 + combine_offset + (d * slots + slot).to(tl.int64) * HIDDEN
            acc += tl.load(src + cols, mask=in_row & (slot >= 0), other=0.0).to(tl.float32)
        tl.store(out + t64 * HIDDEN + cols, acc.to(tl.bfloat16), mask=in_row)
    for d in tl.static_range(NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, d) >> 1) + consumed_offset + rank)
