"""Dispatch kernels: a one-program notify that exchanges the counts and plans the expert segments,
then one kernel in which some programs store tokens into the peers and the others, at the same
time, expand arriving tokens into the grouped layout.

Rows move as int32 words (bf16 x, or FP8 x followed by its UE8M0 scales), so one kernel serves
every payload. Tokens move in tiles of TILE whole rows (two power-of-two pieces of words, load_rows), with
their metadata loaded as [TILE, k] blocks: a program keeps TILE rows in flight, and a token costs no
chain of dependent scalar loads. A receiver stores each row once per pair that lives on its rank, looping
over the pairs compacted to the front (compact_pairs), not over all k.

Where a pair lands needs no sort: every rank knows, from the notify, how many of each source's
tokens picked each of its experts, so segment bases are an aligned cumsum over [source, expert];
the sender ships with each (token, k) the token's rank among its own tokens that picked the same
expert, and row = base[source, expert] + rank. Rows are ordered by expert, then source rank, then
source token, exactly as the torch backend's.

Overlap inside the data kernel (grid = senders + receivers):
- senders store chunks of CHUNK tokens into each remote destination's slots and raise that chunk's
  flag there (the epoch) after its rows, meta and slot range;
- receivers first expand this rank's own tokens straight from x (no staging copy, no wait), then
  each remote source's chunks in order, waiting on each chunk's flag: the expansion of early
  chunks runs while later chunks are still crossing NVLink.
Senders have the lower program ids, so they are placed on SMs first: a receiver that spins never
keeps a sender of its own rank from running.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

from mini_deepep.kernels.signals import (
    peer_offset, release_add_on_peers, release_epoch, wait_at_least, wait_for_peers,
)

NO_SLOT = tl.constexpr(1 << 30)  # above every slot: the min of a chunk with no token for a peer


@triton.jit
def chunk_slots_on(send_slot, chunk, num_tokens, peer, NUM_RANKS: tl.constexpr, CHUNK: tl.constexpr):
    """int32 [CHUNK]: the slot on `peer` of each token of `chunk` (-1: not sent there, or past the last token).
    The sent ones are consecutive, as slots follow token order."""
    t = chunk * CHUNK + tl.arange(0, CHUNK)
    return tl.load(send_slot + t.to(tl.int64) * NUM_RANKS + peer, mask=t < num_tokens, other=-1)


@triton.jit
def first_slot(chunk_slots):
    """The lowest slot of `chunk_slots` that is used (NO_SLOT when none is)."""
    return tl.min(tl.where(chunk_slots >= 0, chunk_slots, NO_SLOT), axis=0)


@triton.jit
def local_expert_ids(expert, rank, EXPERTS_PER_RANK: tl.constexpr):
    """int32 expert ids rebased to `rank`'s local numbering, -1 for experts elsewhere or none (layout.local_expert_ids)."""
    local = expert - rank * EXPERTS_PER_RANK
    return tl.where((expert >= 0) & (local >= 0) & (local < EXPERTS_PER_RANK), local, -1).to(tl.int32)


@triton.jit
def load_rows(rows, ok, WORDS: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr):
    """A tile's rows of WORDS elements (rows: pointers [TILE], loaded where ok, else 0) as two power-of-two
    pieces: words [0, HEAD) and [HEAD, HEAD + TAIL) (HEAD = the largest power of two <= WORDS, TAIL covers the
    rest). One block padded to a power of two would issue masked-off loads and stores for 3/8 of a 5,120-wide
    bf16 row; two pieces issue none for the V4.1 widths (2,560 = 2,048 + 512 words, FP8 1,280 = 1,024 + 256)."""
    head_cols = tl.arange(0, HEAD)[None, :]
    tail_cols = HEAD + tl.arange(0, TAIL)[None, :]
    head = tl.load(rows[:, None] + head_cols, mask=ok[:, None], other=0)
    tail = tl.load(rows[:, None] + tail_cols, mask=ok[:, None] & (tail_cols < WORDS), other=0)
    return head, tail


@triton.jit
def store_rows(rows, ok, head, tail, WORDS: tl.constexpr):
    """Store the pieces of load_rows at int32 pointers rows [TILE] (where ok)."""
    head_cols = tl.arange(0, head.shape[1])[None, :]
    tail_cols = head.shape[1] + tl.arange(0, tail.shape[1])[None, :]
    tl.store(rows[:, None] + head_cols, head, mask=ok[:, None])
    tl.store(rows[:, None] + tail_cols, tail, mask=ok[:, None] & (tail_cols < WORDS))


@triton.jit
def compact_pairs(pos):
    """pos int32 [TILE, TOPK_BLOCK] (-1 = no pair) -> (packed, most): each token's used entries moved to the
    front in k order (-1 after them), and the most any token of the tile has. A loop over `most` then issues
    no stores for the about half of a token's k pairs that live on other ranks."""
    used = pos >= 0
    order = tl.cumsum(used.to(tl.int32), axis=1) - 1  # index of a used entry among its token's used entries
    js = tl.arange(0, pos.shape[1])[None, None, :]
    hit = used[:, :, None] & (order[:, :, None] == js)  # [TILE, k, j]: entry k is the token's j-th used one
    packed = tl.sum(tl.where(hit, pos[:, :, None] + 1, 0), axis=1) - 1
    return packed, tl.max(tl.sum(used.to(tl.int32), axis=1), axis=0)


@triton.jit
def column(block, j):
    """[TILE]: column j of a [TILE, N] register block (j may be a run-time value), e.g. every token's k-th pair."""
    js = tl.arange(0, block.shape[1])[None, :]
    return tl.sum(tl.where(js == j, block, 0), axis=1)


@triton.jit
def _notify(
    buf32, buf64, peer_offsets, tokens_per_rank, tokens_per_expert, segment_base, recv_tokens, source_tokens,
    tokens_per_local_expert, total_rows, num_tokens, rank, epoch, timeout_ns, m_alignment,
    expert_counts_offset, notify_offset, count_offset, source_tokens_offset, error_offset,
    NUM_RANKS: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr, EXPERT_BLOCK: tl.constexpr,
    MAX_LOCAL_EXPERTS: tl.constexpr,
):
    """Publish this rank's counts on every rank, wait for every rank's, then segment_base[s, e] = first output row
    of source s in local expert e, and copy the per-source token counts out of the header (a peer's next notify may
    overwrite them before this call's data kernel is done)."""
    e = tl.arange(0, EXPERT_BLOCK)
    in_range = e < EXPERTS_PER_RANK
    for d in tl.static_range(NUM_RANKS):
        peer = peer_offset(peer_offsets, d)
        counts = tl.load(tokens_per_expert + d * EXPERTS_PER_RANK + e, mask=in_range)
        tl.store(buf32 + peer + expert_counts_offset + rank * MAX_LOCAL_EXPERTS + e, counts, mask=in_range)
        tl.store(buf64 + (peer >> 1) + count_offset + rank, tl.load(tokens_per_rank + d).to(tl.int64))
        tl.store(buf64 + (peer >> 1) + source_tokens_offset + rank, tl.cast(num_tokens, tl.int64))
    for d in tl.static_range(NUM_RANKS):
        release_epoch(buf64 + (peer_offset(peer_offsets, d) >> 1) + notify_offset + rank, epoch)
    for s in tl.static_range(NUM_RANKS):
        wait_at_least(buf64 + notify_offset + s, epoch, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)

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
        tl.store(recv_tokens + s, tl.load(buf64 + count_offset + s).to(tl.int32))
        tl.store(source_tokens + s, tl.load(buf64 + source_tokens_offset + s).to(tl.int32))


@triton.jit(do_not_specialize=["num_tokens", "epoch", "consumed_target"])  # change every call: compile once
def dispatch_notify_kernel(
    buf32, buf64, peer_offsets,
    tokens_per_rank, tokens_per_expert,  # this rank's layout: int32 [R], int32 [R * EXPERTS_PER_RANK]
    segment_base, recv_tokens, source_tokens, tokens_per_local_expert, total_rows,  # out: int32 [R, E_l], [R], [R], [E_l], [1]
    num_tokens, rank, epoch, timeout_ns, m_alignment,
    consumed_target,  # > 0 after a dispatch whose notify ran in its data kernel: wait for the peers' DISPATCH_CONSUMED
    expert_counts_offset, notify_offset, count_offset, source_tokens_offset, consumed_offset, error_offset,  # header
    NUM_RANKS: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr, EXPERT_BLOCK: tl.constexpr,
    MAX_LOCAL_EXPERTS: tl.constexpr,
):
    """One program: _notify. After a dispatch with the notify fused into its data kernel, the peers' counts of that
    call are read by one of their receivers, which this rank's data kernel did not wait for: the peers'
    DISPATCH_CONSUMED of that call (consumed_target) says they are done. Otherwise stream order says so (this
    rank's previous data kernel waited for every peer's chunks, sent after the peer's notify kernel)."""
    if consumed_target > 0:
        wait_for_peers(consumed_offset, consumed_target, rank, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
    _notify(buf32, buf64, peer_offsets, tokens_per_rank, tokens_per_expert, segment_base, recv_tokens, source_tokens,
            tokens_per_local_expert, total_rows, num_tokens, rank, epoch, timeout_ns, m_alignment,
            expert_counts_offset, notify_offset, count_offset, source_tokens_offset, error_offset,
            NUM_RANKS, EXPERTS_PER_RANK, EXPERT_BLOCK, MAX_LOCAL_EXPERTS)


@triton.jit
def store_trace(trace, pid, started, phase1, phase2):
    """trace[pid] = (started, phase1, phase2, now): %globaltimer ns of a program's phases."""
    i = tl.arange(0, 4)
    now = globaltimer()
    stamps = tl.where(i == 0, started, tl.where(i == 1, phase1, tl.where(i == 2, phase2, now)))
    tl.store(trace + pid * 4 + i, stamps)


@triton.jit
def _send_tokens(dst, entry, ok, tokens, x_a, x_b, topk_idx, topk_weights, rank_in_expert, dest, data_offset,
                 meta_offset, TOPK: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr, A_WORDS: tl.constexpr,
                 B_WORDS: tl.constexpr, ROW_HEAD: tl.constexpr, ROW_TAIL: tl.constexpr, B_BLOCK: tl.constexpr,
                 META_WORDS: tl.constexpr,
                 META_BLOCK: tl.constexpr):
    """Store a tile of tokens (int64 [TILE], where `ok`) into a destination's dispatch area (`dst` = its
    buffer as int32) at slots `entry`: the payload rows, and the meta (token, local ids on `dest`,
    weights, ranks in expert). A tile keeps TILE whole rows in flight per program."""
    row_words = A_WORDS + B_WORDS
    head, tail = load_rows(x_a + tokens * A_WORDS, ok, A_WORDS, ROW_HEAD, ROW_TAIL)
    store_rows(dst + data_offset + entry * row_words, ok, head, tail, A_WORDS)
    if B_WORDS > 0:
        b_cols = tl.arange(0, B_BLOCK)
        in_b = ok[:, None] & (b_cols < B_WORDS)[None, :]
        b_words = tl.load(x_b + tokens[:, None] * B_WORDS + b_cols[None, :], mask=in_b)
        tl.store(dst + data_offset + entry[:, None] * row_words + A_WORDS + b_cols[None, :], b_words, mask=in_b)
    j = tl.arange(0, META_BLOCK)[None, :]
    k_of_id = tl.minimum(tl.maximum(j - 1, 0), TOPK - 1)
    k_of_weight = tl.minimum(tl.maximum(j - 1 - TOPK, 0), TOPK - 1)
    k_of_rank = tl.minimum(tl.maximum(j - 1 - 2 * TOPK, 0), TOPK - 1)
    t = tokens[:, None]
    expert = tl.load(topk_idx + t * TOPK + k_of_id, mask=ok[:, None], other=-1)
    weight_bits = tl.load(topk_weights + t * TOPK + k_of_weight, mask=ok[:, None], other=0.0).to(tl.int32, bitcast=True)
    rank_bits = tl.load(rank_in_expert + t * TOPK + k_of_rank, mask=ok[:, None], other=0)
    local = local_expert_ids(expert, dest, EXPERTS_PER_RANK)
    meta = tl.where(j == 0, t.to(tl.int32), tl.where(j <= TOPK, local, tl.where(j <= 2 * TOPK, weight_bits, rank_bits)))
    tl.store(dst + meta_offset + entry[:, None] * META_WORDS + j, meta, mask=ok[:, None] & (j < META_WORDS))


@triton.jit
def _place_tokens(row_a, row_b, ok, local, weight, rank_in_expert, source, slot, token, segment_base, num_rows, slots,
                  out_a, out_b, grouped_layout, row_weights, positions, recv_src_rank, recv_src_token,
                  TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr, EXPERTS_PER_RANK: tl.constexpr,
                  A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, ROW_HEAD: tl.constexpr, ROW_TAIL: tl.constexpr,
                  B_BLOCK: tl.constexpr):
    """Expand a tile of received tokens (where `ok`): each payload (row_a / row_b: int32 word pointers
    [TILE]) goes to the output row of every (token, k) pair routed here, with the pair's expert id and
    weight; the handle learns each token's source, source token and pair rows at entry (source, slot).
    local, weight, rank_in_expert: [TILE, TOPK_BLOCK] (local id -1 = pair not here, and for lanes
    >= TOPK or tokens not ok)."""
    ks = tl.arange(0, TOPK_BLOCK)[None, :]
    base = tl.load(segment_base + source * EXPERTS_PER_RANK + local, mask=local >= 0, other=0)
    pos = tl.where(local >= 0, base + rank_in_expert, -1)
    pos = tl.where(pos < num_rows, pos, -1)  # a caller's fixed row count may drop pairs
    entry = (source * slots + slot).to(tl.int64)
    tl.store(positions + entry[:, None] * TOPK + ks, pos, mask=ok[:, None] & (ks < TOPK))
    tl.store(recv_src_rank + entry, tl.full(entry.shape, source, tl.int32), mask=ok)
    tl.store(recv_src_token + entry, token, mask=ok)
    tl.store(grouped_layout + pos, local, mask=pos >= 0)
    tl.store(row_weights + pos, weight, mask=pos >= 0)
    b_cols = tl.arange(0, B_BLOCK)[None, :]
    head, tail = load_rows(row_a, ok, A_WORDS, ROW_HEAD, ROW_TAIL)
    if B_WORDS > 0:
        b_words = tl.load(row_b[:, None] + b_cols, mask=ok[:, None] & (b_cols < B_WORDS))
    packed, most = compact_pairs(pos)
    for j in range(most):  # every token's j-th pair here at once
        p = column(packed, j).to(tl.int64)  # -1 where a token has fewer
        store_rows(out_a + p * A_WORDS, p >= 0, head, tail, A_WORDS)
        if B_WORDS > 0:
            tl.store(out_b + p[:, None] * B_WORDS + b_cols, b_words, mask=(p >= 0)[:, None] & (b_cols < B_WORDS))


@triton.jit
def _mark_padding_rows(grouped_layout, row_weights, rows, end):
    """Rows `rows` below `end` are padding: expert -1, weight 0."""
    tl.store(grouped_layout + rows, tl.full(rows.shape, -1, tl.int32), mask=rows < end)
    tl.store(row_weights + rows, tl.zeros(rows.shape, tl.float32), mask=rows < end)


@triton.jit
def _fill_unused(receiver, num_receivers, segment_base, tokens_per_local_expert, total_rows, recv_tokens, num_rows,
                 slots, m_alignment, grouped_layout, row_weights, positions, recv_src_rank, recv_src_token,
                 NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr,
                 EXPERTS_PER_RANK: tl.constexpr):
    """Write what the expansion never writes, so the outputs need no fill launches (five fills took ~20 us
    of a ~155 us dispatch): the padding rows of the grouped layout (expert -1, weight 0: the end of each
    expert's aligned segment and the rows past the last segment) and the slots no token used (positions and
    sources -1). Disjoint from the expansion's stores, so the programs need no ordering between the two."""
    lanes = tl.arange(0, 128)
    for e in range(receiver, EXPERTS_PER_RANK, num_receivers):
        count = tl.load(tokens_per_local_expert + e)
        start = tl.load(segment_base + e) + count  # source 0's base is the segment's first row
        end = tl.minimum(start + tl.cdiv(count, m_alignment) * m_alignment - count, num_rows)
        for first in range(start, end, 128):
            _mark_padding_rows(grouped_layout, row_weights, first + lanes, end)
    for first in range(tl.load(total_rows) + receiver * 128, num_rows, num_receivers * 128):
        _mark_padding_rows(grouped_layout, row_weights, first + lanes, num_rows)
    ks = tl.arange(0, TOPK_BLOCK)[None, :]
    for s in tl.static_range(NUM_RANKS):
        for first in range(tl.load(recv_tokens + s) + receiver * 128, slots, num_receivers * 128):
            slot = first + lanes
            entry = (s * slots + slot).to(tl.int64)
            unused = slot < slots
            tl.store(positions + entry[:, None] * TOPK + ks, tl.full([128, TOPK_BLOCK], -1, tl.int32),
                     mask=unused[:, None] & (ks < TOPK))
            tl.store(recv_src_rank + entry, tl.full(entry.shape, -1, tl.int32), mask=unused)
            tl.store(recv_src_token + entry, tl.full(entry.shape, -1, tl.int32), mask=unused)


@triton.jit(do_not_specialize=["num_tokens", "num_rows", "epoch", "consumed_target", "m_alignment"])  # compile once
def dispatch_kernel(
    buf32, buf64, peer_offsets,  # own symmetric buffer as int32 / int64, peer offsets in int32 words
    x_a, x_b,  # payload words: int32 [T, A_WORDS] and [T, B_WORDS] (B_WORDS = 0: x_b unused)
    topk_idx, topk_weights, send_slot, rank_in_expert,  # int64 [T, K], fp32 [T, K], int32 [T, R], int32 [T, K]
    segment_base, source_tokens, recv_tokens, tokens_per_local_expert, total_rows,  # from the notify
    out_a, out_b, grouped_layout, row_weights,  # int32 [M, A_WORDS], [M, B_WORDS], int32 [M], fp32 [M]
    positions, recv_src_rank, recv_src_token,  # int32 [R * slots, TOPK], [R * slots], [R * slots]
    num_tokens, num_rows, rank, epoch, consumed_target, timeout_ns, slots, m_alignment,
    data_offset, meta_offset, flags_offset, ranges_offset,  # dispatch area (int32 words), chunk flags (int64), ranges (int32)
    consumed_offset, error_offset,  # int64-word offsets of header arrays
    tokens_per_rank, tokens_per_expert,  # FUSED_NOTIFY: the notify's inputs (dispatch_notify_kernel)
    expert_counts_offset, notify_offset, count_offset, source_tokens_offset, notified_offset,  # FUSED_NOTIFY: header
    trace,  # TRACE: int64 [grid, 4] %globaltimer ns per program (start, phase 1 done, phase 2 done, end)
    NUM_SENDERS: tl.constexpr, NUM_RANKS: tl.constexpr, TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr,
    EXPERTS_PER_RANK: tl.constexpr, A_WORDS: tl.constexpr, B_WORDS: tl.constexpr, ROW_HEAD: tl.constexpr,
    ROW_TAIL: tl.constexpr, B_BLOCK: tl.constexpr, META_WORDS: tl.constexpr, META_BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    MAX_CHUNKS: tl.constexpr, TILE: tl.constexpr, FUSED_NOTIFY: tl.constexpr, EXPERT_BLOCK: tl.constexpr,
    MAX_LOCAL_EXPERTS: tl.constexpr, TRACE: tl.constexpr,
):
    """Grid: NUM_SENDERS sender programs, then receivers. Tokens move TILE at a time (TILE divides CHUNK).
    FUSED_NOTIFY: the first receiver runs the notify (_notify) while the senders already move rows, and the plan it
    stores (segment_base ... total_rows) is what the other receivers wait for; otherwise dispatch_notify_kernel ran
    before this kernel. Phases traced: senders (waited for the peers' CONSUMED, stored every chunk), receivers (own
    tokens expanded, peers' chunks expanded)."""
    pid = tl.program_id(0)
    if TRACE:
        started = globaltimer()
    row_words = A_WORDS + B_WORDS
    ks = tl.arange(0, TOPK_BLOCK)[None, :]
    lanes = tl.arange(0, TILE)
    num_chunks = tl.cdiv(num_tokens, CHUNK)
    if pid < NUM_SENDERS:
        # Our slots on every peer must be free: its receivers of the previous call are done.
        wait_for_peers(consumed_offset, consumed_target, rank, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
        if TRACE:
            phase1 = globaltimer()
        if NUM_RANKS > 1:
            # Items: chunk-major over the remote destinations, so every peer's chunks arrive in order.
            for item in range(pid, num_chunks * (NUM_RANKS - 1), NUM_SENDERS):
                c = item // (NUM_RANKS - 1)
                dest = (rank + 1 + item % (NUM_RANKS - 1)) % NUM_RANKS
                chunk_slots = chunk_slots_on(send_slot, c, num_tokens, dest, NUM_RANKS, CHUNK)
                end = tl.max(chunk_slots, axis=0) + 1
                start = tl.minimum(first_slot(chunk_slots), end)  # start = end = 0 when none goes to dest
                peer = peer_offset(peer_offsets, dest)
                dst = buf32 + peer
                for first in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, num_tokens), TILE):
                    tokens = (first + lanes).to(tl.int64)
                    slot = tl.load(send_slot + tokens * NUM_RANKS + dest, mask=tokens < num_tokens, other=-1)
                    _send_tokens(dst, (rank * slots + slot).to(tl.int64), slot >= 0, tokens, x_a, x_b, topk_idx,
                                 topk_weights, rank_in_expert, dest, data_offset, meta_offset, TOPK, EXPERTS_PER_RANK,
                                 A_WORDS, B_WORDS, ROW_HEAD, ROW_TAIL, B_BLOCK, META_WORDS, META_BLOCK)
                bounds = tl.arange(0, 2)
                tl.store(dst + ranges_offset + (rank * MAX_CHUNKS + c) * 2 + bounds, tl.where(bounds == 0, start, end))
                release_epoch(buf64 + (peer >> 1) + flags_offset + rank * MAX_CHUNKS + c, epoch)
        if TRACE:
            phase2 = globaltimer()
    else:
        receiver = pid - NUM_SENDERS
        num_receivers = tl.num_programs(0) - NUM_SENDERS
        if FUSED_NOTIFY:
            if receiver == 0:
                # The peers' receivers of the previous call are done with the counts this overwrites on them.
                wait_for_peers(consumed_offset, consumed_target, rank, buf64, peer_offsets, error_offset, timeout_ns,
                               NUM_RANKS)
                _notify(buf32, buf64, peer_offsets, tokens_per_rank, tokens_per_expert, segment_base, recv_tokens,
                        source_tokens, tokens_per_local_expert, total_rows, num_tokens, rank, epoch, timeout_ns,
                        m_alignment, expert_counts_offset, notify_offset, count_offset, source_tokens_offset,
                        error_offset, NUM_RANKS, EXPERTS_PER_RANK, EXPERT_BLOCK, MAX_LOCAL_EXPERTS)
                release_epoch(buf64 + notified_offset, epoch)  # the plan's stores are visible before the flag
            else:
                wait_at_least(buf64 + notified_offset, epoch, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS)
        _fill_unused(receiver, num_receivers, segment_base, tokens_per_local_expert, total_rows, recv_tokens, num_rows,
                     slots, m_alignment, grouped_layout, row_weights, positions, recv_src_rank, recv_src_token,
                     NUM_RANKS, TOPK, TOPK_BLOCK, EXPERTS_PER_RANK)
        # Work is dealt out tile by tile, not chunk by chunk: 4,096 tokens are 128 chunks of 32 but 512 tiles of 8,
        # so ~100 receivers get equal shares instead of one chunk or two (a 2x spread of their end times).
        # This rank's own tokens, straight from x: nothing to wait for.
        for first in range(receiver * TILE, num_tokens, num_receivers * TILE):
            tokens = (first + lanes).to(tl.int64)
            slot = tl.load(send_slot + tokens * NUM_RANKS + rank, mask=tokens < num_tokens, other=-1)
            ok = slot >= 0
            pair = ok[:, None] & (ks < TOPK)
            expert = tl.load(topk_idx + tokens[:, None] * TOPK + ks, mask=pair, other=-1)
            local = local_expert_ids(expert, rank, EXPERTS_PER_RANK)
            weight = tl.load(topk_weights + tokens[:, None] * TOPK + ks, mask=pair, other=0.0)
            in_expert = tl.load(rank_in_expert + tokens[:, None] * TOPK + ks, mask=pair, other=0)
            _place_tokens(x_a + tokens * A_WORDS, x_b + tokens * B_WORDS, ok, local, weight, in_expert, rank, slot,
                          tokens.to(tl.int32), segment_base, num_rows, slots, out_a, out_b, grouped_layout,
                          row_weights, positions, recv_src_rank, recv_src_token,
                          TOPK, TOPK_BLOCK, EXPERTS_PER_RANK, A_WORDS, B_WORDS, ROW_HEAD, ROW_TAIL, B_BLOCK)
        if TRACE:
            phase1 = globaltimer()
        # The peers' tokens as their chunk flags rise: items are (chunk, tile of the chunk), chunk-major, so
        # every receiver takes the chunks in arrival order.
        tiles_per_chunk = CHUNK // TILE
        for j in tl.static_range(1, NUM_RANKS):
            source = (rank + j) % NUM_RANKS
            num_items = tl.cdiv(tl.load(source_tokens + source), CHUNK) * tiles_per_chunk
            for item in range(receiver, num_items, num_receivers):
                c = item // tiles_per_chunk
                wait_at_least(buf64 + flags_offset + source * MAX_CHUNKS + c, epoch, buf64, peer_offsets, error_offset,
                              timeout_ns, NUM_RANKS)
                first = tl.load(buf32 + ranges_offset + (source * MAX_CHUNKS + c) * 2) + item % tiles_per_chunk * TILE
                end = tl.load(buf32 + ranges_offset + (source * MAX_CHUNKS + c) * 2 + 1)
                if first < end:
                    slot = first + lanes
                    ok = slot < end
                    pair = ok[:, None] & (ks < TOPK)
                    entry = (source * slots + slot).to(tl.int64)
                    meta = buf32 + meta_offset + entry * META_WORDS
                    local = tl.load(meta[:, None] + 1 + ks, mask=pair, other=-1)
                    weight = tl.load(meta[:, None] + 1 + TOPK + ks, mask=pair, other=0).to(tl.float32, bitcast=True)
                    in_expert = tl.load(meta[:, None] + 1 + 2 * TOPK + ks, mask=pair, other=0)
                    row = buf32 + data_offset + entry * row_words
                    _place_tokens(row, row + A_WORDS, ok, local, weight, in_expert, source, slot,
                                  tl.load(meta, mask=ok, other=-1), segment_base, num_rows, slots, out_a, out_b,
                                  grouped_layout, row_weights, positions, recv_src_rank, recv_src_token,
                                  TOPK, TOPK_BLOCK, EXPERTS_PER_RANK, A_WORDS, B_WORDS, ROW_HEAD, ROW_TAIL, B_BLOCK)
        if TRACE:
            phase2 = globaltimer()
        # This program is done with the receive area: every source may overwrite its slots again.
        release_add_on_peers(buf64, peer_offsets, consumed_offset, rank, NUM_RANKS)
    if TRACE:
        store_trace(trace, pid, started, phase1, phase2)
