"""Combine kernel: each expert rank reduces the k rows of a received token to one bf16 partial and
stores it into the token's home rank; the home rank adds the partials of all ranks.

Arithmetic (the documented combine semantics): partial = bf16(fp32 sum over this rank's k, in k
order, of w * y); out = bf16(fp32 sum of the partials in rank order).

One kernel, two roles (grid = senders + reducers), overlapping like dispatch:
- senders take slot groups (GROUP slots of one peer) from a work queue in slot order, compute their
  tokens' partials, store them into the home rank and raise that group's flag there;
- reducers walk this rank's own tokens tile by tile, twice: first the own-experts partial straight
  from y into `out` (no waiting), then, as each peer's slot groups arrive, the sum of all partials
  in rank order. With ONE_PASS only the tiles whose partials arrive last do so; the others compute
  the own partial in registers in the same pass as the sum (v7, opt-in until measured on GPUs).
"""

import triton
import triton.language as tl

from triton.language.extra.cuda import globaltimer

from mini_deepep.kernels.dispatch import column, first_slot, load_rows, store_rows, store_trace
from mini_deepep.kernels.signals import (
    peer_offset, release_add_on_peers, release_epoch, wait_at_least, wait_for_peers,
)


@triton.jit
def _pair_weights(row_weights, pairs):
    """fp32 [TILE, TOPK_BLOCK]: the weight of each pair row (0 where pairs is -1), loaded once per tile."""
    return tl.load(row_weights + pairs, mask=pairs >= 0, other=0.0)


@triton.jit
def _weighted_partials(y, weights, pairs, cols, TOPK: tl.constexpr, HIDDEN: tl.constexpr):
    """fp32 [TILE, COLS]: per token of a tile, the sum over k in order of w * y on columns `cols` ([1, COLS]).
    pairs: int32 [TILE, TOPK_BLOCK], the output rows of the token's pairs (-1 = none); weights: _pair_weights.
    The k loop is unrolled, so a program has all k row loads in flight before the first multiply-add."""
    acc = tl.zeros([pairs.shape[0], cols.shape[1]], dtype=tl.float32)
    for k in tl.static_range(TOPK):
        p = column(pairs, k).to(tl.int64)[:, None]
        w = column(weights, k)[:, None]
        rows = tl.load(y + p * HIDDEN + cols, mask=(p >= 0) & (cols < HIDDEN), other=0.0)
        acc += w * rows.to(tl.float32)
    return acc


@triton.jit
def _wait_for_partials(slot_of, ready, flags, rank, epoch, buf64, peer_offsets, error_offset, timeout_ns,
                       NUM_RANKS: tl.constexpr, GROUP: tl.constexpr, MAX_GROUPS: tl.constexpr):
    """Wait until every peer's partials of some tokens are here; returns the updated `ready`.
    slot_of: int32 [N, RANK_BLOCK], the tokens' slots on each rank (-1 = not sent); ready: int32 [1, RANK_BLOCK], per
    peer the last slot group already waited for; flags: the combine group flags [R, MAX_GROUPS] (int64 pointer).
    The tokens' slots on a peer are consecutive: one or two slot groups, of which the first may have been waited for
    by the previous call (tokens go up from call to call)."""
    rr = tl.arange(0, ready.shape[1])[None, :]
    for j in tl.static_range(1, NUM_RANKS):
        expert_rank = (rank + j) % NUM_RANKS
        step_slots = column(slot_of, expert_rank)
        last = tl.max(step_slots, axis=0)  # -1 when no token went there
        last_group = tl.maximum(last, 0) // GROUP
        done = tl.sum(tl.where(rr == expert_rank, ready, 0))
        if (last >= 0) & (last_group > done):
            peer_flags = flags + expert_rank * MAX_GROUPS
            first_group = first_slot(step_slots) // GROUP
            if first_group > done:
                if first_group < last_group:
                    wait_at_least(peer_flags + first_group, epoch, buf64, peer_offsets, error_offset, timeout_ns,
                                  NUM_RANKS)
            wait_at_least(peer_flags + last_group, epoch, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
            ready = tl.where(rr == expert_rank, last_group, ready)
    return ready


@triton.jit
def _reduce_tile_in_one_pass(
    tile, ready, y, row_weights, positions, send_slot, out, buf16, buf64, peer_offsets, flags,
    num_tokens, slots, rank, epoch, timeout_ns, combine_offset, error_offset,
    NUM_RANKS: tl.constexpr, RANK_BLOCK: tl.constexpr, TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr,
    HIDDEN: tl.constexpr, GROUP: tl.constexpr, MAX_GROUPS: tl.constexpr, TILE: tl.constexpr, COLS: tl.constexpr,
):
    """out[tile's tokens] = bf16(sum in rank order of the partials), the own-experts partial computed in registers
    (pass 1's value, never stored), TILE tokens x COLS columns at a time, once the peers' slot groups are here.
    Returns the updated `ready` (_wait_for_partials)."""
    lanes = tl.arange(0, TILE)
    ks = tl.arange(0, TOPK_BLOCK)[None, :]
    rr = tl.arange(0, RANK_BLOCK)[None, :]
    tokens = (tile * TILE + lanes).to(tl.int64)
    ok = tokens < num_tokens
    slot_of = tl.load(send_slot + tokens[:, None] * NUM_RANKS + rr, mask=ok[:, None] & (rr < NUM_RANKS), other=-1)
    ready = _wait_for_partials(slot_of, ready, flags, rank, epoch, buf64, peer_offsets, error_offset, timeout_ns,
                               NUM_RANKS, GROUP, MAX_GROUPS)
    own = column(slot_of, rank)[:, None]
    pairs = tl.load(positions + (rank * slots + own).to(tl.int64) * TOPK + ks, mask=(own >= 0) & (ks < TOPK),
                    other=-1)
    weights = _pair_weights(row_weights, pairs)
    for c0 in range(0, HIDDEN, COLS):
        cols = c0 + tl.arange(0, COLS)[None, :]
        in_row = cols < HIDDEN
        acc = tl.zeros([TILE, COLS], dtype=tl.float32)
        for d in tl.static_range(NUM_RANKS):  # rank order
            if d == rank:
                part = _weighted_partials(y, weights, pairs, cols, TOPK, HIDDEN).to(tl.bfloat16)
            else:
                slot = column(slot_of, d).to(tl.int64)[:, None]
                part = tl.load(buf16 + combine_offset + (d * slots + slot) * HIDDEN + cols, mask=(slot >= 0) & in_row,
                               other=0.0)
            acc += part.to(tl.float32)
        tl.store(out + tokens[:, None] * HIDDEN + cols, acc.to(tl.bfloat16), mask=ok[:, None] & in_row)
    return ready


@triton.jit
def _reduce_tile_second_pass(
    tile, ready, send_slot, out, buf16, buf64, peer_offsets, flags, num_tokens, slots, rank, epoch, timeout_ns,
    combine_offset, error_offset,
    NUM_RANKS: tl.constexpr, RANK_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, GROUP: tl.constexpr,
    MAX_GROUPS: tl.constexpr, TILE: tl.constexpr, ROW_TOKENS: tl.constexpr, ROW_HEAD: tl.constexpr,
    ROW_TAIL: tl.constexpr,
):
    """Pass 2 of a tile whose own-experts partials pass 1 stored in `out`: out = bf16(sum in rank order of the
    partials), once the peers' slot groups are here. Whole rows, ROW_TOKENS tokens at a time: all R partials of both
    row pieces are loaded before the first store, so a step costs one memory round trip instead of one per column
    block. Returns the updated `ready` (_wait_for_partials)."""
    rr = tl.arange(0, RANK_BLOCK)[None, :]
    row_lanes = tl.arange(0, ROW_TOKENS)
    tile_end = tl.minimum(tile * TILE + TILE, num_tokens)
    for first in range(tile * TILE, tile_end, ROW_TOKENS):
        tokens = (first + row_lanes).to(tl.int64)
        ok = tokens < tile_end
        slot_of = tl.load(send_slot + tokens[:, None] * NUM_RANKS + rr, mask=ok[:, None] & (rr < NUM_RANKS), other=-1)
        ready = _wait_for_partials(slot_of, ready, flags, rank, epoch, buf64, peer_offsets, error_offset, timeout_ns,
                                   NUM_RANKS, GROUP, MAX_GROUPS)
        acc_head = tl.zeros([ROW_TOKENS, ROW_HEAD], dtype=tl.float32)
        acc_tail = tl.zeros([ROW_TOKENS, ROW_TAIL], dtype=tl.float32)
        for d in tl.static_range(NUM_RANKS):  # rank order
            slot = column(slot_of, d)
            rows = buf16 + combine_offset + (d * slots + slot).to(tl.int64) * HIDDEN
            here = slot >= 0  # a rank the token did not go to adds +0
            if d == rank:
                rows = out + tokens * HIDDEN
                here = ok
            head, tail = load_rows(rows, here, HIDDEN, ROW_HEAD, ROW_TAIL)
            acc_head += head.to(tl.float32)
            acc_tail += tail.to(tl.float32)
        store_rows(out + tokens * HIDDEN, ok, acc_head.to(tl.bfloat16), acc_tail.to(tl.bfloat16), HIDDEN)
    return ready


# the arguments that change every call are not specialised on: compile once
@triton.jit(do_not_specialize=["num_tokens", "epoch", "consumed_target", "two_pass_from"])
def combine_kernel(
    buf16, buf64, peer_offsets,  # own symmetric buffer as bf16 / int64, peer offsets in int32 words
    y, row_weights, positions, recv_tokens,  # bf16 [M, HIDDEN], fp32 [M], int32 [R * slots, TOPK], int32 [R]
    send_slot, out,  # int32 [T, R] (slot of each own token on each rank, -1 = not sent), bf16 [T, HIDDEN]
    num_tokens, slots, rank, epoch, consumed_target, timeout_ns,
    two_pass_from,  # the first tile reduced in two passes (the ones before it: one pass)
    combine_offset, flags_offset, consumed_offset, error_offset,
    queue_offset,  # buf64[queue_offset + 0 / 1]: the senders' work queue (groups handed out, senders done), 0 at entry
    trace,  # TRACE: int64 [grid, 4] %globaltimer ns per program (start, phase 1 done, phase 2 done, end)
    NUM_SENDERS: tl.constexpr, NUM_RANKS: tl.constexpr, RANK_BLOCK: tl.constexpr, TOPK: tl.constexpr,
    TOPK_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, GROUP: tl.constexpr, MAX_GROUPS: tl.constexpr,
    TILE: tl.constexpr, COLS: tl.constexpr, ROW_TOKENS: tl.constexpr, ROW_HEAD: tl.constexpr, ROW_TAIL: tl.constexpr,
    ONE_PASS: tl.constexpr,  # tiles before two_pass_from in one pass (v7; else every tile in two passes, v6)
    TRACE: tl.constexpr,
):
    """Grid: NUM_SENDERS sender programs, then reducers. Senders, the reducers' pass 1 and their one-pass tiles take
    tokens TILE at a time (TILE divides GROUP), rows COLS columns at a time: a program keeps TILE x k row pieces in
    flight (when launched with the register budget of its programs per SM as maxnreg,
    nvshmem_backend.register_budget; without it ptxas issued half of them at a time) and loads a tile's slots, pair
    rows and weights once, as [TILE, R] and [TILE, k] blocks. Pass 2 takes ROW_TOKENS whole rows at a time, as two
    power-of-two pieces (dispatch.load_rows: ROW_HEAD + ROW_TAIL).
    Phases traced: senders (waited for the peers' CONSUMED, stored every partial), reducers (own partials of the
    two-pass tiles stored, every token reduced)."""
    pid = tl.program_id(0)
    if TRACE:
        started = globaltimer()
    lanes = tl.arange(0, TILE)
    ks = tl.arange(0, TOPK_BLOCK)[None, :]
    if pid < NUM_SENDERS:
        # Every home rank must have finished reading the previous combine's partials.
        wait_for_peers(consumed_offset, consumed_target, rank, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
        if TRACE:
            phase1 = globaltimer()
        if NUM_RANKS > 1:
            # Work items are slot groups of GROUP slots, group-major over the peers, handed out by a work queue:
            # the senders go through the slots in order, each group's flag rises as soon as its group is stored
            # (so the home rank's reducers can start on it), and a sender that loads slowly (a group whose tokens
            # have many pairs here, or a share of the link that is lower than its neighbours') simply takes fewer
            # groups. A fixed deal left the last of 132 senders ~28 us behind the median (session 8's traces).
            most_groups = 0
            for j in tl.static_range(1, NUM_RANKS):
                most_groups = tl.maximum(most_groups, tl.cdiv(tl.load(recv_tokens + (rank + j) % NUM_RANKS), GROUP))
            num_items = most_groups * (NUM_RANKS - 1)
            queue = buf64 + queue_offset
            item = tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
            while item < num_items:
                g = item // (NUM_RANKS - 1)
                home = (rank + 1 + item % (NUM_RANKS - 1)) % NUM_RANKS
                used = tl.load(recv_tokens + home)
                if g * GROUP < used:
                    peer = peer_offset(peer_offsets, home)
                    # Every used slot sends a partial, even when a caller's fixed row count dropped all its
                    # pairs (then zeros): the home rank adds one partial per rank its token went to.
                    for first in tl.static_range(0, GROUP, TILE):
                        slot = g * GROUP + first + lanes
                        ok = (slot < used)[:, None]
                        pairs = tl.load(positions + (home * slots + slot).to(tl.int64)[:, None] * TOPK + ks,
                                        mask=ok & (ks < TOPK), other=-1)
                        weights = _pair_weights(row_weights, pairs)
                        dst = buf16 + 2 * peer + combine_offset + (rank * slots + slot).to(tl.int64)[:, None] * HIDDEN
                        for c0 in range(0, HIDDEN, COLS):
                            cols = c0 + tl.arange(0, COLS)[None, :]
                            acc = _weighted_partials(y, weights, pairs, cols, TOPK, HIDDEN)
                            tl.store(dst + cols, acc.to(tl.bfloat16), mask=ok & (cols < HIDDEN))
                    release_epoch(buf64 + (peer >> 1) + flags_offset + rank * MAX_GROUPS + g, epoch)
                item = tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
            # The last sender out resets the queue for the next call. acq_rel orders every sender's final take
            # before the reset (it took its last item before it counted itself done).
            if tl.atomic_add(queue + 1, 1, sem="acq_rel", scope="gpu") == NUM_SENDERS - 1:
                tl.atomic_xchg(queue, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(queue + 1, 0, sem="relaxed", scope="gpu")
        if TRACE:
            phase2 = globaltimer()
    else:
        reducer = pid - NUM_SENDERS
        num_reducers = tl.num_programs(0) - NUM_SENDERS
        # Each reducer owns every num_reducers-th tile (at the defaults, 512 tiles of 8 tokens over 132 reducers are
        # 3 or 4 each). Strided, not a contiguous run: the slot groups arrive in slot order, which is token order, so
        # the tiles whose partials arrive last are spread over all reducers, one each, and the kernel ends one tile's
        # reduction after the last group lands (a contiguous run left the last reducer ~16 serial steps behind it).
        # A reducer's tiles go up in token order, so it waits for each slot group once (an acquire load at system
        # scope costs about a microsecond).
        # Tiles are reduced in two passes (with ONE_PASS: the tiles from `two_pass_from` on, e.g. each reducer's last):
        # 1. first, without waiting, the own-experts partial straight from y into `out` as bf16 (the value the sum
        #    in rank order adds), while the peers' partials are still on NVLink;
        # 2. when their slot groups have arrived, out = bf16(sum in rank order of the partials), the own one read
        #    back from `out`. The same program wrote it, and the barrier between the passes makes it visible.
        # ONE_PASS (v7, not yet measured on GPUs: docs/reports/deepep-v7-combine-fused.md) reduces the earlier tiles,
        # whose partials arrive while the reducer is still busy, in one pass that computes the own partial in
        # registers: the same arithmetic without writing and re-reading it (2 x 10 KB of HBM traffic per token, which
        # two passes for every tile put on the critical path).
        num_tiles = tl.cdiv(num_tokens, TILE)
        first_late = reducer
        if ONE_PASS:
            first_late += tl.cdiv(tl.maximum(two_pass_from - reducer, 0), num_reducers) * num_reducers
        for tile in range(first_late, num_tiles, num_reducers):
            tokens = (tile * TILE + lanes).to(tl.int64)
            ok = (tokens < num_tokens)[:, None]
            own = tl.load(send_slot + tokens[:, None] * NUM_RANKS + rank, mask=ok, other=-1)
            pairs = tl.load(positions + (rank * slots + own).to(tl.int64) * TOPK + ks, mask=(own >= 0) & (ks < TOPK),
                            other=-1)
            weights = _pair_weights(row_weights, pairs)
            for c0 in range(0, HIDDEN, COLS):
                cols = c0 + tl.arange(0, COLS)[None, :]
                partial = _weighted_partials(y, weights, pairs, cols, TOPK, HIDDEN)
                tl.store(out + tokens[:, None] * HIDDEN + cols, partial.to(tl.bfloat16), mask=ok & (cols < HIDDEN))
        if TRACE:
            phase1 = globaltimer()
        tl.debug_barrier()
        flags = buf64 + flags_offset
        ready = tl.full([1, RANK_BLOCK], -1, tl.int32)  # per peer: the last slot group waited for
        for tile in range(reducer, num_tiles, num_reducers):
            in_one_pass = tile < two_pass_from if ONE_PASS else False  # a compile-time False without ONE_PASS
            if in_one_pass:
                ready = _reduce_tile_in_one_pass(
                    tile, ready, y, row_weights, positions, send_slot, out, buf16, buf64, peer_offsets, flags,
                    num_tokens, slots, rank, epoch, timeout_ns, combine_offset, error_offset,
                    NUM_RANKS, RANK_BLOCK, TOPK, TOPK_BLOCK, HIDDEN, GROUP, MAX_GROUPS, TILE, COLS)
            else:
                ready = _reduce_tile_second_pass(
                    tile, ready, send_slot, out, buf16, buf64, peer_offsets, flags, num_tokens, slots, rank, epoch,
                    timeout_ns, combine_offset, error_offset, NUM_RANKS, RANK_BLOCK, HIDDEN, GROUP, MAX_GROUPS, TILE,
                    ROW_TOKENS, ROW_HEAD, ROW_TAIL)
        if TRACE:
            phase2 = globaltimer()
        # This program is done with the partials: every expert rank may overwrite them again.
        release_add_on_peers(buf64, peer_offsets, consumed_offset, rank, NUM_RANKS)
    if TRACE:
        store_trace(trace, pid, started, phase1, phase2)
