"""Triton kernel of the indexer's exact top-k: the k largest items of each row, equal values ranked by ascending
position (reference.topk_lowest_index), one program per row (or per key chunk of a row: the decode route's first
pass, api._chunked_topk), no host synchronisation.

Each fp32 value becomes an order-preserving uint32 key (negatives: all bits flipped; non-negatives: sign bit set;
-0.0 ranks as +0.0). A radix select on the key's bytes, most significant first, narrows a band [lo, hi] of keys
that holds the k-th largest key: a 256-bin histogram of the next byte of the keys inside the band says which byte
value holds the k-th key and how many keys lie above it. The band is final once it holds exactly the keys still
needed, or one key value: after 4 bytes, or after 2 when no key has low 16 bits of its own (the indexer's scores
are exactly bf16), so the usual row costs 2 passes, not 4. A last pass in position order keeps every key above the
band plus the first `rem` keys inside it (`rem` = k minus the count above): that is the lowest-position-wins rule.
It writes positions through a running prefix count, so they come out ascending without a sort. Narrower digits
(16 or 4 bins: fewer histogram instructions per pass, more passes over the row) were exact and 1.2-1.7x slower on
H200 (session 14 run 1, docs/reports/flashmla-topk-exact.md), so the digits stay bytes.

An item is one value (GROUP = 1) or the max of GROUP consecutive values, the tail padded with -inf (the candidate
blocks, whose ids are written).

Rows of at most 2 x RESIDENT_PAIRS single values (RESIDENT_PAIRS > 0) skip the counting passes when their values are
exactly bf16: the row is read once into registers as bf16 values, two per 32-bit register, and the k-th largest
16-bit key is found bit by bit, most significant first, each bit settled by counting the values at or above a
candidate (one packed compare per two values, where a histogram pass costs ~2.4 warp instructions per value,
ballots and quarter-rate population counts among them; docs/reports/flashmla-topk-exact.md, session 34). Other
rows fall through to the radix passes. Such a bf16 row whose candidates (the values at or above the k-th largest
one, ties included) fit a scratch row of SCRATCH slots is then selected without the selection pass: each candidate
takes a slot from an atomic counter, and a sort of the slots' positions restores their order (_select_appended;
session 35). Every other row takes the selection pass.
"""

from __future__ import annotations

import triton
import triton.language as tl

SIGN_BIT = tl.constexpr(0x80000000)
LOW_HALF = tl.constexpr(0xFFFF)
HIGH_HALF = tl.constexpr(0xFFFF0000)
NEG_INF_KEY16 = tl.constexpr(0x007F)  # the top 16 bits of -inf's key; every finite value's are larger
RADIX_BITS = tl.constexpr(8)
RADIX_BINS = tl.constexpr(256)


@triton.jit
def _order_key(x):
    """uint32 key with key(a) < key(b) iff a < b for fp32 a, b (no NaN); -0.0 and +0.0 share a key."""
    bits = x.to(tl.uint32, bitcast=True)
    key = tl.where((bits & SIGN_BIT) != 0, ~bits, bits | SIGN_BIT)
    return tl.where(x == 0.0, SIGN_BIT, key).to(tl.uint32)


@triton.jit
def _load_items(val_ptr, row_off, offs, n_items, n_values, forced_item, GROUP: tl.constexpr):
    """(value, key, valid) of items offs: value GROUP == 1: val[offs]; else the max of val[offs * GROUP + j],
    j < GROUP, with values at or past n_values as -inf. The item forced_item (-1: none) is +inf."""
    valid = offs < n_items
    if GROUP == 1:
        x = tl.load(val_ptr + row_off + offs, mask=valid, other=float("-inf"))
    else:
        entry = offs[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        x = tl.max(tl.load(val_ptr + row_off + entry, mask=entry < n_values, other=float("-inf")), axis=1)
    x = tl.where(offs == forced_item, float("inf"), x)
    return x, _order_key(x), valid


@triton.jit
def _bf16_bits_of_key(t):
    """The bf16 bits whose key's top 16 bits are t (uint32 <= 0xFFFF): _order_key inverted on 16 bits."""
    return tl.where(t >= 0x8000, t ^ 0x8000, ~t & LOW_HALF).to(tl.uint32)


@triton.jit
def _values_at_least(pairs, t, ASM: tl.constexpr):
    """How many of the bf16 values packed two per uint32 in pairs compare >= the value of 16-bit key t: the keys
    >= t, for every t a search below asks about (a key that is a NaN's compares false; the searches never need
    one). ASM: one packed bf16x2 compare per pair (set.ge.u32.bf16x2: each half 0xFFFF or 0), and the masks summed
    as they are; else the same masks from compares in fp32 (exact: a bf16 widens exactly), for the interpreter.

    The sum of the masks is n_low x 0xFFFF + n_high x 0xFFFF0000 (mod 2^32) with n_low, n_high <= 32,768: its low
    16 bits are -n_low, and (sum + n_low) >> 16 is n_low - n_high, both mod 2^16, so the two counts come back
    without an AND per pair to keep one bit per half (session 34's form: 64 more ALU instructions per round)."""
    bits = _bf16_bits_of_key(t)
    if ASM:
        masks = tl.inline_asm_elementwise("set.ge.u32.bf16x2 $0, $1, $2;", "=r,r,r", [pairs, bits | (bits << 16)],
                                          dtype=tl.uint32, is_pure=True, pack=1)
    else:
        value = (bits << 16).to(tl.float32, bitcast=True)
        low = tl.where((pairs << 16).to(tl.float32, bitcast=True) >= value, LOW_HALF, 0)
        masks = (low | tl.where((pairs & HIGH_HALF).to(tl.float32, bitcast=True) >= value, HIGH_HALF, 0)).to(tl.uint32)
    total = tl.sum(masks).to(tl.uint32)
    n_low = (~total + 1) & LOW_HALF
    n_high = (n_low - ((total + n_low) >> 16)) & LOW_HALF
    return (n_low + n_high).to(tl.int32)


@triton.jit
def _resident_band(val_ptr, row_off, n_items, k, PAIRS: tl.constexpr, ASM: tl.constexpr):
    """(t, rem, kk, candidates, bf16_row) for a row of n_items <= 2 x PAIRS values held in registers: the radix
    select's band is the one 16-bit key t (keys t << 16 .. (t << 16) | 0xFFFF) with rem of its keys still to take;
    candidates = how many values are >= t's (the keys above the band and the band's). bf16_row tells whether these
    hold (every value exactly bf16), else the caller runs the passes.
    A bf16 value is the top 16 bits of its fp32; the values 2i and 2i + 1 share a register. With kk = min(k, finite
    values), the k-th largest key is the largest 16-bit t with at least kk keys >= t, settled bit by bit from the
    top; the band is that one key and rem = kk - (keys above it). Every t tried is at least 0x0080 (the most
    negative finite value's key) while kk >= 1; kk = 0 leaves t = 0xFFFF (a NaN's key, which no value has) and
    rem = 0, so nothing is selected."""
    pos = tl.arange(0, PAIRS)[:, None] * 2 + tl.arange(0, 2)[None, :]
    bits = tl.load(val_ptr + row_off + pos, mask=pos < n_items, other=float("-inf")).to(tl.uint32, bitcast=True)
    bf16_row = tl.max(bits & LOW_HALF) == 0
    even, odd = tl.split(bits)
    pairs = (even >> 16) | (odd & HIGH_HALF)
    kk = tl.minimum(k, _values_at_least(pairs, tl.full((), NEG_INF_KEY16 + 1, tl.uint32), ASM))
    t = tl.zeros((), tl.uint32)
    at_least_t = tl.zeros((), tl.int32)
    for bit in tl.static_range(15, -1, -1):
        candidate = t | (1 << bit)
        count = _values_at_least(pairs, candidate, ASM)
        t = tl.where(count >= kk, candidate, t)
        at_least_t = tl.where(count >= kk, count, at_least_t)
    above = tl.where(t < LOW_HALF, _values_at_least(pairs, tl.minimum(t + 1, LOW_HALF), ASM), 0)
    return t, kk - above, kk, at_least_t, bf16_row


@triton.jit
def _select_appended(val_ptr, row_off, n_items, t, candidates, kk, rem, k, first, scratch_ptr, out_ptr,
                     BLOCK: tl.constexpr, SCRATCH: tl.constexpr, THREADS: tl.constexpr, ASM: tl.constexpr):
    """The selection of a bf16 row (or chunk) whose band is the one 16-bit key t (from _resident_band) and whose
    candidates (values >= t's value: kk - rem above the band, then the band) number at most SCRATCH: out[0:kk] =
    the positions (plus first) of every value above the band and of the rem lowest-positioned band values,
    ascending; out[kk:k] = -1.

    One more pass over the row: each candidate takes a slot of the program's scratch row (int32 [SCRATCH + 1], the
    counter at SCRATCH) and writes 2 x position + (in the band) there; a thread takes the slots of its candidates
    in a step with one atomic add. tl.sort then orders the codes by position, a scan over the band flags ranks the
    band, and a second scan packs the kept ones. Per value that is two float compares, an in-thread count and a
    predicated store, where the selection pass costs a block-wide scan (~70 instructions per value;
    docs/reports/flashmla-topk-exact.md, session 35). The values are exactly bf16, so comparing them in fp32 with
    t's value compares their keys (-0.0 equal to +0.0); kk = 0 leaves t a NaN's key, which no value compares >=
    to. THREADS is the program's thread count (32 x num_warps). Under the interpreter (whose atomics do not hand
    out distinct slots) the slots come from a scan over the threads, and the codes are ordered by rank instead of by
    tl.sort; CPU CI therefore covers the rank and pack, the GPU tests the atomics and the sort."""
    band_value = (_bf16_bits_of_key(t) << 16).to(tl.float32, bitcast=True)
    if ASM:
        tl.store(scratch_ptr + SCRATCH, 0)
        tl.debug_barrier()
    # A step is RUNS runs of THREADS values, thread i holding value i of each run: a thread counts its candidates
    # in registers and takes their slots with one atomic (ptxas sums them per warp first, so one atomic per warp).
    # The offsets pass through an opaque move: the scattered stores want one value per thread and run, and loads
    # vectorized into another layout would cost a shared-memory round trip per step.
    RUNS: tl.constexpr = max(4, BLOCK // THREADS)
    written = tl.zeros((), tl.int32)
    offs = tl.arange(0, THREADS)[:, None] + tl.arange(0, RUNS)[None, :] * THREADS
    if ASM:
        offs = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [offs], dtype=tl.int32, is_pure=True, pack=1)
    x_next = tl.load(val_ptr + row_off + offs, mask=offs < n_items, other=float("-inf"))
    for b in range(0, tl.cdiv(n_items, RUNS * THREADS)):
        # the next step's values are loaded before this step's atomic: one load latency per row, not per step
        x = x_next
        # the offsets summed in int32 before the pointer: ptr + row_off + offs + c would add each term in 64 bits
        # per value (session 36, offline: 382 instead of 446 SASS instructions per 8,192-value step)
        offs_next = offs + RUNS * THREADS
        x_next = tl.load(val_ptr + row_off + offs_next, mask=offs_next < n_items, other=float("-inf"))
        code = tl.where(x >= band_value, offs * 2 + (x == band_value).to(tl.int32), -1)
        take = (code >= 0).to(tl.int32)
        per_thread = tl.sum(take, axis=1)
        if ASM:
            base = tl.atomic_add(scratch_ptr + SCRATCH + tl.zeros_like(per_thread), per_thread, mask=per_thread > 0,
                                 sem="relaxed", scope="cta")
        else:
            base = written + tl.cumsum(per_thread, 0) - per_thread
            written += tl.sum(per_thread)
        slot = base[:, None] + tl.cumsum(take, axis=1) - take
        tl.store(scratch_ptr + slot, code, mask=code >= 0)
        offs = offs_next
    tl.debug_barrier()
    s = tl.arange(0, SCRATCH)
    code = tl.load(scratch_ptr + s, mask=s < candidates, other=0x7FFFFFFF)
    if ASM:
        code = tl.sort(code)
    else:  # the interpreter runs tl.sort's network slowly (~2.5 s per 256 codes): each code goes to its rank instead
        rank = tl.sum((code[None, :] < code[:, None]).to(tl.int32), axis=1)  # the candidates' codes are distinct
        tl.store(scratch_ptr + rank, code, mask=s < candidates)
        code = tl.load(scratch_ptr + s, mask=s < candidates, other=0x7FFFFFFF)
    in_band = ((code & 1) != 0) & (s < candidates)
    keep = (s < candidates) & (~in_band | (tl.cumsum(in_band.to(tl.int32), 0) <= rem))
    tl.store(out_ptr + tl.cumsum(keep.to(tl.int32), 0) - 1, (code >> 1) + first, mask=keep)
    tl.store(out_ptr + s, tl.full((SCRATCH,), -1, tl.int32), mask=(s >= kk) & (s < k))


@triton.jit
def topk_select_kernel(
    val_ptr, stride_val, n_values, n_items, k, forced_item,
    out_ptr, stride_out, chunk_len, scratch_ptr,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, RESIDENT_PAIRS: tl.constexpr = 0,
    SCRATCH: tl.constexpr = 0, THREADS: tl.constexpr = 512, ASM: tl.constexpr = True,
):
    """Grid (rows * CHUNKS,). val fp32 [rows, n_values] (no NaN), row stride stride_val, unit column stride; items
    as in _load_items; 1 <= k <= n_items.
    out int32 [rows, k] = the positions of the k selected items whose value is not -inf, ascending, then -1
    (reference.indexer_topk_ref; with GROUP > 1 reference.candidate_blocks_ref).
    CHUNKS > 1 (GROUP 1, no forced item): program row * CHUNKS + c selects among the row's items
    [c * chunk_len, (c + 1) * chunk_len) only, writing their positions in the row (ascending, then -1) to out row
    row * CHUNKS + c: the first pass of api._chunked_topk, whose candidates hold the row's top k.
    RESIDENT_PAIRS > 0 (GROUP 1, no forced item, at most 2 x RESIDENT_PAIRS items per row or chunk): a bf16 row's
    (or chunk's) band comes from _resident_band, and the counting passes run no steps. SCRATCH > 0 (with
    RESIDENT_PAIRS; a power of two >= k): such a row with at most SCRATCH candidates is selected by
    _select_appended through its program's scratch row, int32 [SCRATCH + 1] at scratch_ptr + (SCRATCH + 1) x
    program, instead of by the selection pass; THREADS = 32 x num_warps.
    """
    # the selection pass packs a step's two counts into one int32: BLOCK x 2^16 + BLOCK must stay below 2^31
    tl.static_assert(BLOCK <= 16384, "the selection pass counts a step's keys in 16-bit fields of an int32")
    row_off = (tl.program_id(0) // CHUNKS).to(tl.int64) * stride_val
    out_row = out_ptr + tl.program_id(0).to(tl.int64) * stride_out
    first = 0
    k_select = k  # out rows hold k slots; a chunk shorter than k selects all its items
    if CHUNKS > 1:  # the chunk as a row of its own: the value pointer moves, positions are offset back at the store
        first = (tl.program_id(0) % CHUNKS) * chunk_len
        val_ptr += first
        n_items = tl.minimum(n_items - first, chunk_len)
        n_values = n_items
        k_select = tl.minimum(k, n_items)
    offs0 = tl.arange(0, BLOCK)
    bins = tl.arange(0, RADIX_BINS)
    n_blocks = tl.cdiv(n_items, BLOCK)

    # radix select: [lo, hi] holds the k-th largest key; rem of the keys in the band are still to be taken
    lo = tl.full((), 0, tl.uint32)
    hi = ~lo
    rem = k_select + tl.zeros((), tl.int32)
    done = rem < 0  # false, as a tensor so the passes below can update it
    appended = done
    if RESIDENT_PAIRS > 0:
        t, resident_rem, kk, candidates, done = _resident_band(val_ptr, row_off, n_items, k_select, RESIDENT_PAIRS,
                                                               ASM)
        lo = tl.where(done, (t << 16).to(tl.uint32), lo)
        hi = tl.where(done, ((t << 16) | LOW_HALF).to(tl.uint32), hi)
        rem = tl.where(done, resident_rem, rem)
        if SCRATCH > 0:
            appended = done & (candidates <= SCRATCH)
            if appended:
                _select_appended(val_ptr, row_off, n_items, t, candidates, kk, rem, k, first,
                                 scratch_ptr + tl.program_id(0).to(tl.int64) * (SCRATCH + 1), out_row,
                                 BLOCK, SCRATCH, THREADS, ASM)
    bf16_keys = done
    for p in tl.static_range(4):
        shift = 24 - RADIX_BITS * p
        hist = tl.zeros((RADIX_BINS,), tl.int32)
        # pass 0: per lane, whether a key had low 16 bits that are not a bf16's (reduced once, after the pass)
        other_low_bits = tl.zeros((BLOCK,), tl.int32)
        for b in range(0, tl.where(done, 0, n_blocks)):
            offs = b * BLOCK + offs0
            x, key, valid = _load_items(val_ptr, row_off, offs, n_items, n_values, forced_item, GROUP)
            in_band = valid & (key >= lo) & (key <= hi)
            digit = ((key >> shift) & (RADIX_BINS - 1)).to(tl.int32)
            hist += tl.histogram(digit, RADIX_BINS, mask=in_band)
            if p == 0:
                low = key & LOW_HALF  # 0 for a non-negative bf16, all ones for a negative one (flipped)
                other_low_bits |= (valid & (low != 0) & (low != LOW_HALF)).to(tl.int32)
        above = tl.sum(hist) - tl.cumsum(hist, 0)  # keys in the band with a larger byte than each bin
        hit = (above < rem) & (above + hist >= rem)  # exactly one bin while rem >= 1
        digit_k = tl.sum(tl.where(hit, bins, 0)).to(tl.uint32)
        new_rem = rem - tl.sum(tl.where(hit, above, 0))
        new_lo = (lo | (digit_k << shift)).to(tl.uint32)
        lo = tl.where(done, lo, new_lo)
        hi = tl.where(done, hi, (new_lo | ((1 << shift) - 1)).to(tl.uint32))
        band_full = tl.sum(tl.where(hit, hist, 0)) == new_rem
        rem = tl.where(done, rem, new_rem)
        if p == 0:
            bf16_keys = tl.max(other_low_bits) == 0
        if p == 1:
            done = done | bf16_keys
        done = done | band_full

    # selection in position order: all keys above the band, the first rem keys in it, -inf never. A band key that
    # is -inf is either the whole band (a one-value band) or in a band taken whole, so ranking the band's finite keys
    # alone selects the same items. One scan counts both kinds: keys above the band in the low 16 bits, finite band
    # keys above them.
    written = tl.zeros((), tl.int32)
    band_seen = tl.zeros((), tl.int32)
    for b in range(0, tl.where(appended, 0, n_blocks)):
        offs = b * BLOCK + offs0
        x, key, valid = _load_items(val_ptr, row_off, offs, n_items, n_values, forced_item, GROUP)
        above_band = (valid & (key > hi)).to(tl.int32)
        in_band = (valid & (key >= lo) & (key <= hi) & (x != float("-inf"))).to(tl.int32)
        counts = above_band + (in_band << 16)
        packed = tl.cumsum(counts, 0)
        band_upto = band_seen + (packed >> 16)  # band keys up to and including this one
        keep = (above_band != 0) | ((in_band != 0) & (band_upto <= rem))
        slot = written + (packed & 0xFFFF) + tl.minimum(band_upto, rem) - tl.minimum(band_seen, rem) - 1
        tl.store(out_row + slot, offs + first, mask=keep)
        total = tl.sum(counts)
        written += (total & 0xFFFF) + tl.minimum(band_seen + (total >> 16), rem) - tl.minimum(band_seen, rem)
        band_seen += total >> 16
    for s0 in range(0, tl.where(appended, 0, k), BLOCK):
        slot = s0 + offs0
        tl.store(out_row + slot, tl.full((BLOCK,), -1, tl.int32), mask=(slot >= written) & (slot < k))
