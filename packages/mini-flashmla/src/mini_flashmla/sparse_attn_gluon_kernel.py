"""Gluon kernel of sparse MLA attention (prefill and unsplit decode): bf16 rows, or the paged quantized cache (FP8
window rows, FP4 compressed rows). Warp-specialized: a producer warpgroup gathers (and dequantizes) 64-slot blocks
into a 2-deep ring of bf16 tiles while two consumer warpgroups run the block's MMAs and softmax.

Why: the Triton kernel (sparse_attn_kernel.py) spends ~5.5 us (bf16 rows) to ~11 us (quantized rows) per 64-slot
block against ~1 us of tensor-core work (docs/reports/flashmla-sparse-attention.md): it lays the 64 x 64 QK^T MMA out
over both warpgroups with the same rows (the QK half of the FLOPs done twice), holds the gathered rows in registers
across the dequantization (255 registers and spills), and serializes gather, dequantization and MMAs. A first Gluon
version (session 11, in one partition) fixed the first two; its breakdown (benchmarks/exp_flashmla_gluon_breakdown.py,
docs/reports/flashmla-gluon.md) showed the gathers (bf16 rows) and the dequantization (quantized rows) still in
series with the MMAs. Here they run in their own warps:

- Producer (worker partition, PRODUCER_WARPS warps): for each block, its 64 row ids (loaded a block ahead into a
  shared-memory ring, where the consumers read their masks too), then
  - bf16 rows: cp.async straight into the tile, completion tracked by the tile's `full` mbarrier (cp.async's own
    arrive, one per producer thread), so up to two blocks' gathers are in flight;
  - quantized rows: cp.async of the raw bytes into one staging buffer (a compressed block, or half a window block at
    a time: 16 KB of values + 2 KB of scales), then shared -> registers -> shared into the tile, exactly
    cache_layout's unpack (every value has at most 6 significant bits: the scale multiply is exact in bf16), in
    layouts whose 16-byte shared stores and loads are free of bank conflicts.
  It waits on the tile's `empty` mbarrier before writing into it.
- Consumers (default partition, 8 warps = 2 warpgroups): Q [64, 512] bf16 in shared memory for the whole walk;
  per block, wait `full`, S = Q K^T as one wgmma per warpgroup on 32 of the 64 slots, the softmax's row max and sum
  reduced across the two warpgroups, P rounded to bf16 and handed to the PV wgmma from registers (each warpgroup
  owns 256 of the 512 output columns: a 128-register fp32 accumulator per thread), then arrive on `empty`.

Numerics are the Triton kernel's (and the reference's): blocks of 64 slots in order (window, then compressed), the
running max from -1e30 in the log2 domain, P rounded to bf16 before P.V, the sink in the denominator only, lse
without the sink. Empty slots (-1, or an id outside the cache) gather row 0 of their cache (any valid row: their
score is -inf, so P is exactly 0 and the finite values add nothing); a source with no rows is never routed here.

Shared memory, one CTA per SM: Q 64 KB + 2 bf16 tiles 128 KB + 1 KB of staged ids (+ 18 KB of raw staging for
quantized rows).

Measured on H200 (docs/reports/flashmla-gluon.md): 1.30x the Triton kernel with bf16 rows, 1.66x with paged rows at
the prefill shape; a version whose consumers split the head dim instead of the slots was slower. Decode by CUDA-graph
replay at batch 64 / 128 / 256: 49.2 / 56.3 / 109.5 us against 82.2 / 95.7 / 181.6 (session 13 run 3). Session 23
(conflict-free dequantization, ids staged a block ahead): paged prefill 220 -> 254-255 TFLOP/s, decode 42-43 / 49-50
/ 96 us. api routes every unsplit call of whole 64-head programs here.
"""

from __future__ import annotations

from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring
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
PRODUCER_WARPS: gl.constexpr = gl.constexpr(4)  # 8 would launch 16 warps at 128 registers: ptxas needs 158 (PV wgmma)
PRODUCER_REGS: gl.constexpr = gl.constexpr(96)
NEG_INIT: gl.constexpr = gl.constexpr(-1e30)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)

# Producer layouts (PRODUCER_WARPS warps). cp.async moves 16 B per copy: a window row is 32 + 1 copies, a compressed
# row 16 + 2.
BF16_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PRODUCER_WARPS, 1], [1, 0])  # [64, 512] bf16 rows
WINDOW_COPY: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [PRODUCER_WARPS, 1], [1, 0])  # [32, 512] B: half a block
WINDOW_SCALE_COPY: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [PRODUCER_WARPS, 1], [1, 0])  # [32, 16] bytes
COMPRESSED_COPY: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [PRODUCER_WARPS, 1], [1, 0])  # [64, 256] bytes
COMPRESSED_SCALE_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [PRODUCER_WARPS, 1], [1, 0])  # [64, 32] bytes
# Dequantization, DEQUANT_ROWS rows at a time (64 values per thread: the producer's registers are few): a thread
# reads whole scale groups (window: 32 B, compressed: 16 B = two groups of 8 bytes), so a scale multiplies its group
# by a broadcast in registers; the 2-D loads reshape to these without data movement. A warp spans 8 rows and 4
# threads along a row, rows fastest across lanes (order [0, 1]): a 16-byte access is served 8 lanes at a time, and
# those 8 lanes, at one place in 8 consecutive rows, write the 8 units of one 128-byte line of the tile's 128 B
# swizzle (unit ^= row % 8) and read 8 different units of the swizzled staging buffer: conflict-free. Nsight
# Compute: [2 rows, 16 threads] put 8 threads of a row on 2 units, 4x the ideal store wavefronts (session 17: 69%
# of the kernel's shared-store wavefronts were conflicts); [8, 4] with the columns fastest, 2x (session 23 run 1).
DEQUANT_ROWS: gl.constexpr = gl.constexpr(16)
WINDOW_LOAD: gl.constexpr = gl.BlockedLayout([1, 32], [8, 4], [1, PRODUCER_WARPS], [0, 1])  # [16, 512] bytes
# [16, 16, 32] window bytes and [16, 32, 8] compressed bytes
WINDOW_GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, PRODUCER_WARPS, 1], [0, 1, 2])
COMPRESSED_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [1, PRODUCER_WARPS], [0, 1])  # [16, 256] bytes
COMPRESSED_GROUPS: gl.constexpr = gl.BlockedLayout([1, 2, 8], [8, 4, 1], [1, PRODUCER_WARPS, 1], [0, 1, 2])
# Consumer layouts (8 warps): both warpgroups stacked along N ([4, 2] warps), each computing all 64 heads on half of
# the columns.
Q_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])  # [64, 512] bf16
S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
P_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
TILE_SHARED: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
# Raw values: 16-byte units swizzled by row (unit ^= row % 8, as the tile), so the dequantization's loads of 8 rows
# at one column are conflict-free; cp.async still writes whole 16-byte units. Scales: plain rows.
RAW_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
SCALES_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
# A block's 64 slot ids, staged one block ahead; every producer thread loads one of them (each id twice over the
# 128 threads). Four slots: while the consumers read block b's, the producer may already store block b + 2's
# (its tile ring lets it run one block ahead), and block b + 3's only after the consumers released block b.
IDS_SLOTS: gl.constexpr = gl.constexpr(4)
IDS_LOAD: gl.constexpr = gl.BlockedLayout([1], [32], [PRODUCER_WARPS], [0])
IDS_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])


@gluon.jit
def _block_ids(blk, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len):
    """int32 [64] slot ids of logical block blk (source A's blocks, then source B's) in IDS_LOAD, -1 past the end of
    its list (or of the walk)."""
    in_a = blk < a_blocks
    ids_ptr = gl.where(in_a, a_ids_ptr, b_ids_ptr)
    pos = gl.where(in_a, blk, blk - a_blocks) * BLOCK_N + gl.arange(0, BLOCK_N, IDS_LOAD)
    return gl.load(ids_ptr + pos, mask=pos < gl.where(in_a, a_len, b_len), other=-1)


@gluon.jit
def _staged_rows(ids_slot, num_rows, first, n: gl.constexpr, layout: gl.constexpr):
    """int64 [n] cache rows of slots first .. first + n - 1 of a block whose 64 ids are in shared memory; empty slots
    (-1, or an id outside the cache) read row 0."""
    ids = ids_slot.slice(first, n).load(layout)
    return gl.where((ids >= 0) & (ids < num_rows), ids, 0).to(gl.int64)


@gluon.jit
def _gather_raw(raw_vals, raw_scales, kv_ptr, ids_slot, num_rows, first, FORMAT: gl.constexpr):
    """cp.async one part of a quantized block into the staging buffer (32 window rows or 64 compressed rows from
    slot `first` of the block) and wait for it; every producer thread's copies have landed on return."""
    if FORMAT == FP8_WINDOW:
        rows = _staged_rows(ids_slot, num_rows, first, 32, gl.SliceLayout(1, WINDOW_COPY))
        cols = gl.arange(0, 512, gl.SliceLayout(0, WINDOW_COPY))
        vals = raw_vals._reinterpret(gl.uint8, [32, 512], RAW_SHARED)
        async_copy.async_copy_global_to_shared(vals, kv_ptr + rows[:, None] * WINDOW_ROW + cols[None, :])
        rows = _staged_rows(ids_slot, num_rows, first, 32, gl.SliceLayout(1, WINDOW_SCALE_COPY))
        cols = gl.arange(0, 16, gl.SliceLayout(0, WINDOW_SCALE_COPY))
        async_copy.async_copy_global_to_shared(raw_scales.slice(0, 32, dim=0).slice(0, 16, dim=1),
                                               kv_ptr + rows[:, None] * WINDOW_ROW + 512 + cols[None, :])
    else:
        rows = _staged_rows(ids_slot, num_rows, first, 64, gl.SliceLayout(1, COMPRESSED_COPY))
        cols = gl.arange(0, 256, gl.SliceLayout(0, COMPRESSED_COPY))
        async_copy.async_copy_global_to_shared(raw_vals, kv_ptr + rows[:, None] * COMPRESSED_ROW + cols[None, :])
        rows = _staged_rows(ids_slot, num_rows, first, 64, gl.SliceLayout(1, COMPRESSED_SCALE_COPY))
        cols = gl.arange(0, 32, gl.SliceLayout(0, COMPRESSED_SCALE_COPY))
        async_copy.async_copy_global_to_shared(raw_scales,
                                               kv_ptr + rows[:, None] * COMPRESSED_ROW + 256 + cols[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()


@gluon.jit
def _dequant_raw(raw_vals, raw_scales, tile_rows, FORMAT: gl.constexpr):
    """The staging buffer's rows -> bf16 into `tile_rows` (32 window or 64 compressed rows of a tile), equal to
    cache_layout's unpack functions bit for bit."""
    R: gl.constexpr = DEQUANT_ROWS
    if FORMAT == FP8_WINDOW:
        vals = raw_vals._reinterpret(gl.uint8, [32, 512], RAW_SHARED)
        for c in gl.static_range(32 // R):
            q = gl.reshape(vals.slice(c * R, R, dim=0).load(WINDOW_LOAD), [R, 16, 32])
            q = gl.convert_layout(q, WINDOW_GROUPS, assert_trivial=True)
            e = raw_scales.slice(c * R, R, dim=0).slice(0, 16, dim=1).load(gl.SliceLayout(2, WINDOW_GROUPS))
            scale = (e.to(gl.int16) << 7).to(gl.bfloat16, bitcast=True)  # UE8M0 -> 2^(e-127): bf16's exponent field
            x = q.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * scale[:, :, None]
            tile_rows.slice(c * R, R, dim=0).store(gl.reshape(x, [R, D]))
    else:
        for c in gl.static_range(BLOCK_N // R):
            packed = gl.reshape(raw_vals.slice(c * R, R, dim=0).load(COMPRESSED_LOAD), [R, 32, 8])
            packed = gl.convert_layout(packed, COMPRESSED_GROUPS, assert_trivial=True)
            s = raw_scales.slice(c * R, R, dim=0).load(gl.SliceLayout(2, COMPRESSED_GROUPS))
            scale, packed = gl.broadcast(s.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)[:, :, None], packed)
            even = gl.inline_asm_elementwise(_SCALED_LOW_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                             is_pure=True, pack=4)
            odd = gl.inline_asm_elementwise(_SCALED_HIGH_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                            is_pure=True, pack=4)
            # byte j -> dims 2j (low nibble), 2j + 1
            tile_rows.slice(c * R, R, dim=0).store(gl.reshape(gl.join(even, odd), [R, D]))


@gluon.jit
def _quantized_block(raw_vals, raw_scales, tile, empty_bar, empty_phase, kv_ptr, ids_slot, num_rows,
                     FORMAT: gl.constexpr):
    """One quantized block into `tile`: window blocks in two halves of 32 rows (the staging buffer holds 16 KB of
    values), compressed blocks whole. The first part's gather runs before the wait for the tile."""
    PARTS: gl.constexpr = 2 if FORMAT == FP8_WINDOW else 1
    ROWS: gl.constexpr = BLOCK_N // PARTS
    for part in gl.static_range(PARTS):
        _gather_raw(raw_vals, raw_scales, kv_ptr, ids_slot, num_rows, part * ROWS, FORMAT)
        if part == 0:
            mbarrier.wait(empty_bar, empty_phase)
        _dequant_raw(raw_vals, raw_scales, tile.slice(part * ROWS, ROWS, dim=0), FORMAT)
        gl.thread_barrier()  # every thread has read the staging buffer before the next gather overwrites it


@gluon.jit
def _producer(tiles, raw_vals, raw_scales, ids_smem, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr, a_len,
              a_rows, b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr):
    """Worker partition: every block, in order, into tile blk % 2 once the consumers have released it (the first lap
    waits on the barriers' initial phase, which counts as complete). A block's ids are loaded from global memory
    one block ahead into ids_smem (slot blk % IDS_SLOTS), where the gathers and the consumers' masks read them:
    their latency is not in front of the gather (Nsight Compute, session 17: ~23% of the quantized producer's stall
    samples waited on the ids) nor in the consumers' loop. The store of block blk + 1's ids comes before the
    producer's arrival on block blk's "full" barrier."""
    ids_smem.index(0).store(_block_ids(0, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len))
    gl.thread_barrier()
    for blk in range(n_blocks):
        t = blk % TILES
        empty_phase = ((blk // TILES) & 1) ^ 1
        in_a = blk < a_blocks
        num_rows = gl.where(in_a, a_rows, b_rows)
        next_ids = _block_ids(blk + 1, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len)  # stored after this block
        ids_slot = ids_smem.index(blk % IDS_SLOTS)
        if A_FORMAT == BF16_ROWS:
            rows = _staged_rows(ids_slot, num_rows, 0, BLOCK_N, gl.SliceLayout(1, BF16_COPY))
            cols = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
            mbarrier.wait(empty.index(t), empty_phase)
            async_copy.async_copy_global_to_shared(tiles.index(t), a_kv_ptr + rows[:, None] * D + cols[None, :])
            # each producer thread's arrive fires when its copies have landed (PRODUCER_WARPS x 32 of full's count)
            async_copy.mbarrier_arrive(full.index(t), increment_count=False)
            ids_smem.index((blk + 1) % IDS_SLOTS).store(next_ids)
        else:
            if in_a:
                _quantized_block(raw_vals, raw_scales, tiles.index(t), empty.index(t), empty_phase, a_kv_ptr, ids_slot,
                                 num_rows, A_FORMAT)
            else:
                _quantized_block(raw_vals, raw_scales, tiles.index(t), empty.index(t), empty_phase, b_kv_ptr, ids_slot,
                                 num_rows, B_FORMAT)
            ids_smem.index((blk + 1) % IDS_SLOTS).store(next_ids)
            fence_async_shared()  # the tile's generic-proxy stores before the consumers' wgmma reads
        # One arrival (the last of full's count), after the partition barrier Gluon puts before a single-thread
        # operation: every producer thread's ids store is ordered before it, so before the consumers' reads.
        mbarrier.arrive(full.index(t), count=1)


@gluon.jit
def _consumer(q_smem, tiles, ids_smem, full, empty, q_ptr, stride_q_s, stride_q_h, n_blocks, a_blocks, a_rows, b_rows,
              sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2,
              HAS_SINK: gl.constexpr):
    """Default partition (8 warps): the online softmax over the blocks the producer delivers; writes out and lse."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_COPY))
    dims = gl.arange(0, D, gl.SliceLayout(0, Q_COPY))
    async_copy.async_copy_global_to_shared(q_smem,
                                           q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()  # every consumer thread's part of Q has landed

    m_i = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_MMA))
    # The row sums are kept per column and reduced once after the walk: a per-block gl.sum over the columns crosses
    # the two warpgroups (S is split by slots), two of the block's partition barriers (session 12 run 1: 3.54 ->
    # 3.43 us per block for bf16 rows, 5.21 -> 5.05 paged). It costs 16 registers per consumer thread and changes
    # the order of l's fp32 sums.
    l_cols = gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_MMA)
    acc = gl.full([HEADS, D], 0.0, gl.float32, O_MMA)
    for blk in range(n_blocks):
        t = blk % TILES
        num_rows = gl.where(blk < a_blocks, a_rows, b_rows)
        mbarrier.wait(full.index(t), (blk // TILES) & 1)
        ids = ids_smem.index(blk % IDS_SLOTS).load(gl.SliceLayout(0, S_MMA))  # -1 past the list's end
        valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
        fence_async_shared()  # Q's and the bf16 rows' cp.async (generic-proxy) writes before wgmma's reads
        kv = tiles.index(t)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_MMA),
                          use_acc=False)
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_cols = l_cols * alpha[:, None] + p
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_MMA))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_OPERAND)  # P rounded to bf16 before P.V, as the reference
        acc = warpgroup_mma(p_op, kv, acc)
        # One thread arrives, after the partition barrier Gluon puts before a single-thread operation: both
        # warpgroups have finished their (synchronous) MMAs on the tile.
        mbarrier.arrive(empty.index(t), count=1)

    l_i = gl.sum(l_cols, 1)
    has_mass = l_i > 0
    lse = gl.where(has_mass, (m_i + gl.log2(l_i)) * LN2, float("-inf"))
    denom = l_i
    rows = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_MMA))
    if HAS_SINK:
        denom = denom + gl.exp2(gl.load(sink_ptr + rows) * LOG2E - m_i)  # sink in the denominator only
    gl.store(lse_ptr + sq * stride_lse_s + rows, lse)
    denom = gl.convert_layout(denom, gl.SliceLayout(1, O_MMA))
    o = gl.where(denom[:, None] > 0, acc / denom[:, None], 0.0).to(gl.bfloat16)
    out_heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, O_MMA))
    out_dims = gl.arange(0, D, gl.SliceLayout(0, O_MMA))
    gl.store(out_ptr + sq * stride_out_s + out_heads[:, None] * stride_out_h + out_dims[None, :], o)


@gluon.jit
def _ring_buffers(A_FORMAT: gl.constexpr, CONSUMERS: gl.constexpr):
    """The shared memory the producer fills and the consumers release: the ring of bf16 tiles, the quantized rows'
    staging buffer (bf16 rows: none, the tiles stand in), the ring of staged slot ids, and per tile a "full"
    mbarrier (the producer's one arrival, plus for bf16 rows one cp.async arrival per producer thread) and an
    "empty" one (one arrival per consumer partition: CONSUMERS)."""
    tiles = gl.allocate_shared_memory(gl.bfloat16, [TILES, BLOCK_N, D], TILE_SHARED)
    if A_FORMAT == BF16_ROWS:
        raw_vals = tiles  # unused
        raw_scales = tiles
    else:
        raw_vals = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, 256], RAW_SHARED)
        raw_scales = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, 32], SCALES_SHARED)
    ids_smem = gl.allocate_shared_memory(gl.int32, [IDS_SLOTS, BLOCK_N], IDS_SHARED)
    full = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    for t in gl.static_range(TILES):
        mbarrier.init(full.index(t), count=PRODUCER_WARPS * 32 + 1 if A_FORMAT == BF16_ROWS else 1)
        mbarrier.init(empty.index(t), count=CONSUMERS)
    return tiles, raw_vals, raw_scales, ids_smem, full, empty


@gluon.jit
def _query_blocks(a_ids_ptr, stride_a_ids, a_len, b_ids_ptr, stride_b_ids, b_len, HAS_B: gl.constexpr):
    """This program's query (program_id(0)): (its rows of both id lists, source A's 64-slot blocks, all blocks)."""
    sq = gl.program_id(0)
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)
    return a_ids_ptr + sq * stride_a_ids, b_ids_ptr + sq * stride_b_ids, a_blocks, n_blocks


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
    """Grid (s_q, h // 64), num_warps 8 (the consumers; the producer's 4 warps come on top). Source A's blocks, then
    source B's (if HAS_B; bf16 rows come alone); writes out bf16 [s_q, h, 512] and lse fp32 [s_q, h] (natural log,
    without the sink; -inf for a row with no valid slot)."""
    a_ids_ptr, b_ids_ptr, a_blocks, n_blocks = _query_blocks(a_ids_ptr, stride_a_ids, a_len, b_ids_ptr, stride_b_ids,
                                                             b_len, HAS_B)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, D], TILE_SHARED)
    tiles, raw_vals, raw_scales, ids_smem, full, empty = _ring_buffers(A_FORMAT, 1)  # one consumer partition
    gl.warp_specialize(
        [(_consumer, (q_smem, tiles, ids_smem, full, empty, q_ptr, stride_q_s, stride_q_h, n_blocks, a_blocks, a_rows,
                      b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s, qk_scale_log2,
                      HAS_SINK)),
         (_producer, (tiles, raw_vals, raw_scales, ids_smem, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr,
                      a_len, a_rows, b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT))],
        [PRODUCER_WARPS], [PRODUCER_REGS])
    _invalidate_ring(full, empty)
