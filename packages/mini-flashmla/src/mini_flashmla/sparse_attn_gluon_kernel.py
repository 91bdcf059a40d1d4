"""Gluon kernel of sparse MLA attention (prefill and unsplit decode): bf16 rows, or the paged quantized cache (FP8
window rows, FP4 compressed rows). Warp-specialized: a producer warpgroup gathers (and dequantizes) 64-slot blocks
into a 2-deep ring of bf16 tiles while two consumer warpgroups each compute half of every dot product.

Why: the Triton kernel (sparse_attn_kernel.py) spends ~5.5 us (bf16 rows) to ~11 us (quantized rows) per 64-slot
block against ~1 us of tensor-core work (docs/reports/flashmla-sparse-attention.md): it lays the 64 x 64 QK^T MMA out
over both warpgroups with the same rows (the QK half of the FLOPs done twice), holds the gathered rows in registers
across the dequantization (255 registers and spills), and serializes gather, dequantization and MMAs. Session 11's
Gluon versions and their breakdowns (docs/reports/flashmla-gluon.md, benchmarks/exp_flashmla_gluon_breakdown.py)
led here: the gathers and dequantization go to their own warps, and the consumers split the head dim, not the slots,
so the softmax needs no reduction across warpgroups (the slot split needed seven partition barriers per block).

- Producer (worker partition, 4 warps), per block in order, into tile blk % 2 once both consumers released it:
  - bf16 rows: cp.async straight into the tile; each producer thread's cp.async arrive on the tile's `full` mbarrier
    fires when its copies land, so up to two blocks' gathers are in flight;
  - quantized rows: the block's index slots by cp.async one block ahead, then 16 rows at a time gathered into
    registers (the next 16 in flight under this dequantization), dequantized exactly as cache_layout's unpack (every
    value has at most 6 significant bits: the scale multiply is exact in bf16) and stored into the tile.
- Consumers (the default partition and a worker, one warpgroup each): warpgroup w owns dims w * 256 .. w * 256 + 255
  of the head dim. Per block: wait `full`; its half of S = Q K^T [64 heads, 64 slots] as one wgmma from shared
  memory; the halves swapped through shared memory (mbarriers `s_ready` / `s_free`) and added in one order, so both
  hold the same S; the whole online softmax; P rounded to bf16 straight from the accumulator registers into the PV
  wgmma's A operand; P V into its 256 output columns (a 128-register fp32 accumulator); arrive on `empty`.

Numerics match the Triton kernel and the reference: blocks of 64 slots in order (window, then compressed), the
running max from -1e30 in the log2 domain, P rounded to bf16 before P.V, the sink in the denominator only, lse
without the sink; S's fp32 sums are formed as two halves of 256 dims, a different order than the Triton kernel's.
Empty slots (-1, or an id outside the cache) gather row 0 of their cache (any valid row: their score is -inf, so P
is exactly 0 and the finite values add nothing); a source with no rows is never routed here.

Shared memory, one CTA per SM: Q 64 KB + 2 bf16 tiles 128 KB + the S halves 32 KB (+ 512 B of index slots).
"""

from __future__ import annotations

from mini_deepgemm.gemm_gluon_kernel import _SCALED_HIGH_PTX, _SCALED_LOW_PTX
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

# Row formats (the values of sparse_attn_kernel's FORMAT_* constants) and their byte layouts (cache_layout.py).
BF16_ROWS: gl.constexpr = gl.constexpr(0)  # bf16 [n, 512]
FP8_WINDOW: gl.constexpr = gl.constexpr(1)  # 512 B e4m3, then 16 B UE8M0 (one per 32 dims)
FP4_COMPRESSED: gl.constexpr = gl.constexpr(2)  # 256 B e2m1 pairs (low nibble = even dim), then 32 B e4m3 (per 16)
WINDOW_ROW: gl.constexpr = gl.constexpr(528)
COMPRESSED_ROW: gl.constexpr = gl.constexpr(288)

BLOCK_N: gl.constexpr = gl.constexpr(64)  # slots per block: the reference's online-softmax step
HEADS: gl.constexpr = gl.constexpr(64)  # heads per CTA: the wgmma M side
D: gl.constexpr = gl.constexpr(512)
TILES: gl.constexpr = gl.constexpr(2)  # bf16 tiles in the ring: the producer fills one while the consumers read one
PRODUCER_WARPS: gl.constexpr = gl.constexpr(4)
PRODUCER_REGS: gl.constexpr = gl.constexpr(72)
CONSUMER_REGS: gl.constexpr = gl.constexpr(216)  # the second consumer (a worker partition); the first gets the same
NEG_INIT: gl.constexpr = gl.constexpr(-1e30)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)

# Producer layouts (4 warps). bf16 rows: cp.async, 16 B per copy.
BF16_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # [64, 512] bf16 rows
IDS_COPY: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # [64] int32 (threads past 64 repeat a copy)
# Quantized rows travel through registers, CHUNK rows at a time: a thread loads whole scale groups (window: 32 B,
# compressed: 16 B = two groups of 8 bytes) as 16-byte vectors, so a scale multiplies its group by a broadcast in
# registers; the 2-D loads reshape to the 3-D group layouts without data movement.
CHUNK: gl.constexpr = gl.constexpr(16)
WINDOW_LOAD: gl.constexpr = gl.BlockedLayout([1, 32], [2, 16], [4, 1], [1, 0])  # [16, 512] bytes
WINDOW_GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, 32], [2, 16, 1], [4, 1, 1], [2, 1, 0])  # [16, 16, 32]
COMPRESSED_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0])  # [16, 256] bytes
COMPRESSED_GROUPS: gl.constexpr = gl.BlockedLayout([1, 2, 8], [2, 16, 1], [4, 1, 1], [2, 1, 0])  # [16, 32, 8] bytes
# Consumer layouts (one warpgroup each): S [64 heads, 64 slots] and the output half [64, 256] as wgmma accumulators;
# P goes from S's accumulator registers to the PV wgmma's A operand without leaving the warpgroup.
Q_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # [64, 256] bf16 (a consumer's half of Q)
S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
P_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
TILE_SHARED: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
XCHG_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])
IDS_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])


@gluon.jit
def _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows):
    """Logical block -> (in source A, ids pointer of its query row, ids length, cache rows, block within its source)."""
    in_a = blk < a_blocks
    ids_ptr = gl.where(in_a, a_ids_ptr, b_ids_ptr)
    ids_len = gl.where(in_a, a_len, b_len)
    num_rows = gl.where(in_a, a_rows, b_rows)
    local = gl.where(in_a, blk, blk - a_blocks)
    return in_a, ids_ptr, ids_len, num_rows, local


@gluon.jit
def _clamped_rows(ids, num_rows):
    """int64 cache rows of index slots; empty slots (-1, or outside the cache) read row 0 (module docstring)."""
    return gl.where((ids >= 0) & (ids < num_rows), ids, 0).to(gl.int64)


@gluon.jit
def _load_chunk(kv_ptr, ids_slot, num_rows, c, FORMAT: gl.constexpr):
    """Raw (values, scales) of rows c * CHUNK .. of a quantized block, gathered into registers."""
    if FORMAT == FP8_WINDOW:
        rows = _clamped_rows(ids_slot.slice(c * CHUNK, CHUNK).load(gl.SliceLayout(1, WINDOW_LOAD)), num_rows)
        vals = gl.load(kv_ptr + rows[:, None] * WINDOW_ROW + gl.arange(0, 512, gl.SliceLayout(0, WINDOW_LOAD))[None, :])
        scale_layout: gl.constexpr = gl.SliceLayout(2, WINDOW_GROUPS)
        rows = _clamped_rows(ids_slot.slice(c * CHUNK, CHUNK).load(gl.SliceLayout(1, scale_layout)), num_rows)
        scales = gl.load(kv_ptr + rows[:, None] * WINDOW_ROW + 512 + gl.arange(0, 16, gl.SliceLayout(0, scale_layout))[None, :])
    else:
        rows = _clamped_rows(ids_slot.slice(c * CHUNK, CHUNK).load(gl.SliceLayout(1, COMPRESSED_LOAD)), num_rows)
        vals = gl.load(kv_ptr + rows[:, None] * COMPRESSED_ROW
                       + gl.arange(0, 256, gl.SliceLayout(0, COMPRESSED_LOAD))[None, :])
        scale_layout: gl.constexpr = gl.SliceLayout(2, COMPRESSED_GROUPS)
        rows = _clamped_rows(ids_slot.slice(c * CHUNK, CHUNK).load(gl.SliceLayout(1, scale_layout)), num_rows)
        scales = gl.load(kv_ptr + rows[:, None] * COMPRESSED_ROW + 256
                         + gl.arange(0, 32, gl.SliceLayout(0, scale_layout))[None, :])
    return vals, scales


@gluon.jit
def _dequant_chunk(vals, scales, tile_rows, FORMAT: gl.constexpr):
    """A chunk's raw values and scales -> bf16 rows stored into `tile_rows`, equal to cache_layout's unpack
    functions bit for bit."""
    if FORMAT == FP8_WINDOW:
        q = gl.convert_layout(gl.reshape(vals, [CHUNK, 16, 32]), WINDOW_GROUPS, assert_trivial=True)
        scale = (scales.to(gl.int16) << 7).to(gl.bfloat16, bitcast=True)  # UE8M0 -> 2^(e-127): bf16's exponent field
        x = q.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * scale[:, :, None]
        tile_rows.store(gl.reshape(x, [CHUNK, D]))
    else:
        packed = gl.convert_layout(gl.reshape(vals, [CHUNK, 32, 8]), COMPRESSED_GROUPS, assert_trivial=True)
        scale, packed = gl.broadcast(scales.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)[:, :, None], packed)
        even = gl.inline_asm_elementwise(_SCALED_LOW_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)
        odd = gl.inline_asm_elementwise(_SCALED_HIGH_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                        is_pure=True, pack=4)
        tile_rows.store(gl.reshape(gl.join(even, odd), [CHUNK, D]))  # byte j -> dims 2j (low nibble), 2j + 1


@gluon.jit
def _quantized_block(tile, empty_bar, empty_phase, kv_ptr, ids_slot, num_rows, FORMAT: gl.constexpr):
    """One quantized block into `tile`, chunk by chunk, the next chunk's gather in flight under this one's
    dequantization; the first chunk's gather is issued before the wait for the tile."""
    vals, scales = _load_chunk(kv_ptr, ids_slot, num_rows, 0, FORMAT)
    mbarrier.wait(empty_bar, empty_phase)
    for c in gl.static_range(BLOCK_N // CHUNK):
        if c + 1 < BLOCK_N // CHUNK:
            next_vals, next_scales = _load_chunk(kv_ptr, ids_slot, num_rows, c + 1, FORMAT)
        _dequant_chunk(vals, scales, tile.slice(c * CHUNK, CHUNK, dim=0), FORMAT)
        if c + 1 < BLOCK_N // CHUNK:
            vals, scales = next_vals, next_scales


@gluon.jit
def _issue_ids(ids_ring, blk, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows):
    """cp.async block blk's 64 index slots into ids_ring[blk % 2] as one commit group (empty past the last block).
    Slots past the list are not copied: their stale values only steer a gather (clamped) and the consumers mask
    them by position."""
    if blk < n_blocks:
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, IDS_COPY)
        async_copy.async_copy_global_to_shared(ids_ring.index(blk % 2), ids_ptr + pos, mask=pos < ids_len)
    async_copy.commit_group()


@gluon.jit
def _producer(tiles, ids_ring, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
              b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr):
    """Worker partition: every block, in order, into tile blk % 2 once both consumers have released it (the first lap
    waits on the barriers' initial phase, which counts as complete)."""
    if A_FORMAT != BF16_ROWS:
        _issue_ids(ids_ring, 0, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows)
    for blk in range(n_blocks):
        t = blk % TILES
        empty_phase = ((blk // TILES) & 1) ^ 1
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        if A_FORMAT == BF16_ROWS:
            pos = local * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(1, BF16_COPY))
            rows = _clamped_rows(gl.load(ids_ptr + pos, mask=pos < ids_len, other=-1), num_rows)
            cols = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
            mbarrier.wait(empty.index(t), empty_phase)
            async_copy.async_copy_global_to_shared(tiles.index(t), a_kv_ptr + rows[:, None] * D + cols[None, :])
            # each producer thread's arrive fires when its copies have landed (full counts PRODUCER_WARPS x 32)
            async_copy.mbarrier_arrive(full.index(t), increment_count=False)
        else:
            async_copy.wait_group(0)
            gl.thread_barrier()  # block blk's index slots (copied by all producer threads) are readable
            _issue_ids(ids_ring, blk + 1, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows)
            ids_slot = ids_ring.index(blk % 2)
            if in_a:
                _quantized_block(tiles.index(t), empty.index(t), empty_phase, a_kv_ptr, ids_slot, num_rows, A_FORMAT)
            else:
                _quantized_block(tiles.index(t), empty.index(t), empty_phase, b_kv_ptr, ids_slot, num_rows, B_FORMAT)
            fence_async_shared()  # the tile's generic-proxy stores before the consumers' wgmma reads
            mbarrier.arrive(full.index(t), count=1)  # after the partition barrier Gluon puts before it


@gluon.jit
def _consumer(q_smem, tiles, xchg, full, empty, s_ready, s_free, q_ptr, stride_q_s, stride_q_h, n_blocks, a_blocks,
              a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h,
              lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG (0 or 1) owns dims WG * 256 .. of the head dim: its half of every QK^T dot product,
    exchanged with the other warpgroup (S = S_0 + S_1 in both, so both hold the same bits), the full softmax, and
    the PV product into its 256 output columns. Writes its half of out, and (WG 0) lse."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    half: gl.constexpr = D // 2
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_COPY))
    dims = WG * half + gl.arange(0, half, gl.SliceLayout(0, Q_COPY))
    q_half = q_smem.slice(WG * half, half, dim=1)
    async_copy.async_copy_global_to_shared(q_half, q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()  # every thread's part of this half of Q has landed

    m_i = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_MMA))
    l_i = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_MMA))
    acc = gl.full([HEADS, half], 0.0, gl.float32, O_MMA)
    for blk in range(n_blocks):
        t = blk % TILES
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_MMA))
        ids = gl.load(ids_ptr + pos, mask=pos < ids_len, other=-1)  # its latency overlaps the wait below
        valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
        mbarrier.wait(full.index(t), (blk // TILES) & 1)
        fence_async_shared()  # Q's and the bf16 rows' cp.async (generic-proxy) writes before wgmma's reads
        kv = tiles.index(t).slice(WG * half, half, dim=1)  # [64 slots, 256]: K for QK^T (permuted), V for PV
        s_own = warpgroup_mma(q_half, kv.permute((1, 0)), gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_MMA),
                              use_acc=False)
        mbarrier.wait(s_free.index(WG), (blk & 1) ^ 1)  # the other warpgroup has read our previous half
        xchg.index(WG).store(s_own)
        mbarrier.arrive(s_ready.index(WG), count=1)  # after the partition barrier: all our threads have stored
        mbarrier.wait(s_ready.index(1 - WG), blk & 1)
        s_other = xchg.index(1 - WG).load(S_MMA)
        mbarrier.arrive(s_free.index(1 - WG), count=1)
        if WG == 0:  # one order in both warpgroups: the same bits
            s = s_own + s_other
        else:
            s = s_other + s_own
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_MMA), assert_trivial=True)[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_OPERAND)  # P rounded to bf16 before P.V, as the reference
        acc = warpgroup_mma(p_op, kv, acc)
        # one thread arrives, after the partition barrier Gluon puts before a single-thread operation: this
        # warpgroup's (synchronous) MMAs on the tile are done; the producer waits for both warpgroups
        mbarrier.arrive(empty.index(t), count=1)

    has_mass = l_i > 0
    denom = l_i
    if HAS_SINK:
        denom = denom + gl.exp2(gl.load(sink_ptr + head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_MMA))) * LOG2E - m_i)
    if WG == 0:
        lse = gl.where(has_mass, (m_i + gl.log2(l_i)) * LN2, float("-inf"))  # without the sink
        gl.store(lse_ptr + sq * stride_lse_s + head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_MMA)), lse)
    denom = gl.convert_layout(denom, gl.SliceLayout(1, O_MMA), assert_trivial=True)
    o = gl.where(denom[:, None] > 0, acc / denom[:, None], 0.0).to(gl.bfloat16)
    out_heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, O_MMA))
    out_dims = WG * half + gl.arange(0, half, gl.SliceLayout(0, O_MMA))
    gl.store(out_ptr + sq * stride_out_s + out_heads[:, None] * stride_out_h + out_dims[None, :], o)


# a_len / b_len = 1 specialised as a constant crashes triton 3.6's LLVM lowering (an assertion in
# ConvertTritonGPUToLLVM, seen on H200 with one window slot): the lengths and row counts stay runtime values.
@gluon.jit(do_not_specialize=["a_len", "a_rows", "b_len", "b_rows"])
def sparse_mla_fwd_gluon_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_rows,
    sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    qk_scale_log2,
    A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr, HAS_B: gl.constexpr, HAS_SINK: gl.constexpr,
):
    """Grid (s_q, h // 64), num_warps 4 (the first consumer; the second and the producer come on top). Source A's
    blocks, then source B's (if HAS_B; bf16 rows come alone); writes out bf16 [s_q, h, 512] and lse fp32 [s_q, h]
    (natural log, without the sink; -inf for a row with no valid slot)."""
    sq = gl.program_id(0)
    a_ids_ptr += sq * stride_a_ids
    b_ids_ptr += sq * stride_b_ids
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, D], TILE_SHARED)
    tiles = gl.allocate_shared_memory(gl.bfloat16, [TILES, BLOCK_N, D], TILE_SHARED)
    xchg = gl.allocate_shared_memory(gl.float32, [2, HEADS, BLOCK_N], XCHG_SHARED)  # each warpgroup's half of S
    ids_ring = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N], IDS_SHARED)  # quantized rows: blocks blk, blk + 1
    full = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    s_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=PRODUCER_WARPS * 32 if A_FORMAT == BF16_ROWS else 1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
        mbarrier.init(s_ready.index(i), count=1)
        mbarrier.init(s_free.index(i), count=1)
    gl.warp_specialize(
        [(_consumer, (q_smem, tiles, xchg, full, empty, s_ready, s_free, q_ptr, stride_q_s, stride_q_h, n_blocks,
                      a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr, stride_out_s,
                      stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 0)),
         (_consumer, (q_smem, tiles, xchg, full, empty, s_ready, s_free, q_ptr, stride_q_s, stride_q_h, n_blocks,
                      a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows, sink_ptr, out_ptr, stride_out_s,
                      stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2, HAS_SINK, 1)),
         (_producer, (tiles, ids_ring, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                      b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    for i in gl.static_range(2):
        mbarrier.invalidate(full.index(i))
        mbarrier.invalidate(empty.index(i))
        mbarrier.invalidate(s_ready.index(i))
        mbarrier.invalidate(s_free.index(i))
