"""Gluon kernel of sparse MLA prefill and decode: bf16 rows, or the paged quantized cache (FP8 window rows, FP4
compressed rows).

Why: the Triton kernel (sparse_attn_kernel.py) spends ~5.5 us (bf16 rows) to ~11 us (quantized rows) per 64-slot
block against ~1 us of tensor-core work (docs/reports/flashmla-sparse-attention.md): Triton lays the 64 x 64 QK^T MMA
out over both warpgroups with the same rows (the QK half of the FLOPs done twice), keeps the gathered rows in
registers across the dequantization (255 registers and spills), and waits for each block's index load before its
gather. Gluon lets the kernel state the schedule:

- One CTA of two warpgroups per query token and 64 heads. Q [64, 512] bf16 sits in shared memory for the whole walk.
- Index slots travel by cp.async one block ahead of their rows (a 3-slot ring), so no global load sits between a
  block's wait and the next block's gather.
- Rows of block i + 1 (gathered by row id, 16 B per copy) stream in by cp.async while block i is computed: bf16 rows
  straight into a 2-deep ring of bf16 tiles; quantized rows as raw bytes into a 2-deep ring, then dequantized
  shared -> registers -> shared by all 256 threads into one bf16 tile. The tile [64 slots, 512] (128 B swizzle) is
  both the K operand (permuted view) and the V operand of wgmma.
- S = Q K^T as one wgmma per warpgroup on 32 of the 64 slots (no duplicated rows), the softmax's row max and sum
  reduced across the two warpgroups, P rounded to bf16 and handed to the PV wgmma from registers, each warpgroup
  owning 256 of the 512 output columns (a 128-register fp32 accumulator per thread).

Numerics are the Triton kernel's (and the reference's): blocks of 64 slots in order (window, then compressed), the
running max from -1e30 in the log2 domain, P rounded to bf16 before P.V, the sink in the denominator only, lse
without the sink. The dequantized values are the same bits (every value has at most 6 significant bits, so the
scale multiply is exact in bf16).

Empty slots (-1, or an id outside the cache) gather row 0 of their cache (any valid row: their score is -inf, so P
is exactly 0 and the finite values add nothing); a source with no rows is never routed here.

Shared memory, one CTA per SM: Q 64 KB + bf16 tiles 2 x 64 KB (bf16 rows), or Q 64 KB + one tile 64 KB + raw ring
2 x (32 KB values + 2 KB scales) (quantized rows); plus 768 B of index slots.
"""

from __future__ import annotations

from mini_deepgemm.gemm_gluon_kernel import _SCALED_HIGH_PTX, _SCALED_LOW_PTX
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

# Row formats (the values of sparse_attn_kernel's FORMAT_* constants) and their byte layouts (cache_layout.py).
BF16_ROWS: gl.constexpr = gl.constexpr(0)  # bf16 [n, 512]
FP8_WINDOW: gl.constexpr = gl.constexpr(1)  # 512 B e4m3, then 16 B UE8M0 (one per 32 dims)
FP4_COMPRESSED: gl.constexpr = gl.constexpr(2)  # 256 B e2m1 pairs (low nibble = even dim), then 32 B e4m3 (per 16)
WINDOW_ROW: gl.constexpr = gl.constexpr(528)
COMPRESSED_ROW: gl.constexpr = gl.constexpr(288)

BLOCK_N: gl.constexpr = gl.constexpr(64)  # slots per block: the reference's online-softmax step
HEADS: gl.constexpr = gl.constexpr(64)  # heads per CTA: the wgmma M side
D: gl.constexpr = gl.constexpr(512)
STAGES: gl.constexpr = gl.constexpr(2)  # raw-byte ring depth (3 does not fit next to Q and the bf16 tile)
NEG_INIT: gl.constexpr = gl.constexpr(-1e30)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)

# Register layouts of the 256 threads (8 warps).
# cp.async of a block's quantized values: 16 B per copy; a window row is 32 copies, a compressed row 16.
WINDOW_COPY: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0])  # [64, 512] bytes
COMPRESSED_COPY: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [8, 1], [1, 0])  # [64, 256] bytes
WINDOW_SCALE_COPY: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [8, 1], [1, 0])  # [64, 16] bytes
COMPRESSED_SCALE_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # [64, 32] bytes
# Dequantization: a thread reads whole scale groups (window: 32 B, compressed: 16 B = two groups of 8 bytes), so a
# scale multiplies its group by a broadcast in registers; the [64, n] loads reshape to these without data movement.
WINDOW_LOAD: gl.constexpr = gl.BlockedLayout([1, 32], [2, 16], [8, 1], [1, 0])  # [64, 512] bytes
COMPRESSED_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [8, 1], [1, 0])  # [64, 256] bytes
WINDOW_GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, 32], [2, 16, 1], [8, 1, 1], [2, 1, 0])  # [64, 16, 32]
COMPRESSED_GROUPS: gl.constexpr = gl.BlockedLayout([1, 2, 8], [2, 16, 1], [8, 1, 1], [2, 1, 0])  # [64, 32, 8] bytes
# MMAs: both warpgroups stacked along N ([4, 2] warps), so each computes all 64 heads on half of the columns.
S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
P_OPERAND: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
TILE_SHARED: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
RAW_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
BF16_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])  # [64, 512] bf16 (Q, rows), 16 B per copy
IDS_COPY: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])  # [64] int32 (threads past 64 repeat a copy)
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
def _issue_ids(ids_ring, blk, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows):
    """cp.async block blk's 64 index slots into ids_ring[blk % 3] (in the caller's commit group). Slots past the
    list are not copied: their stale values only steer a gather (clamped) and are masked by position when scored."""
    if blk < n_blocks:
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, IDS_COPY)
        async_copy.async_copy_global_to_shared(ids_ring.index(blk % 3), ids_ptr + pos, mask=pos < ids_len)


@gluon.jit
def _gathered_rows(ids, num_rows, layout: gl.constexpr):
    """int64 [64] row ids of a block (from its ids_ring slot) in `layout`; empty slots read row 0 (module docstring)."""
    i = ids.load(layout)
    return gl.where((i >= 0) & (i < num_rows), i, 0).to(gl.int64)


@gluon.jit
def _issue_rows(vals, scales, kv_ptr, ids, num_rows, FORMAT: gl.constexpr):
    """cp.async one block's rows of a source: bf16 rows straight into the tile `vals`; quantized rows as raw values and
    scales into a ring slot."""
    if FORMAT == BF16_ROWS:
        rows = _gathered_rows(ids, num_rows, gl.SliceLayout(1, BF16_COPY))
        cols = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
        async_copy.async_copy_global_to_shared(vals, kv_ptr + rows[:, None] * D + cols[None, :])
    elif FORMAT == FP8_WINDOW:
        rows = _gathered_rows(ids, num_rows, gl.SliceLayout(1, WINDOW_COPY))
        cols = gl.arange(0, 512, gl.SliceLayout(0, WINDOW_COPY))
        async_copy.async_copy_global_to_shared(vals, kv_ptr + rows[:, None] * WINDOW_ROW + cols[None, :])
        rows = _gathered_rows(ids, num_rows, gl.SliceLayout(1, WINDOW_SCALE_COPY))
        cols = gl.arange(0, 16, gl.SliceLayout(0, WINDOW_SCALE_COPY))
        async_copy.async_copy_global_to_shared(scales.slice(0, 16, dim=1),
                                               kv_ptr + rows[:, None] * WINDOW_ROW + 512 + cols[None, :])
    else:
        rows = _gathered_rows(ids, num_rows, gl.SliceLayout(1, COMPRESSED_COPY))
        cols = gl.arange(0, 256, gl.SliceLayout(0, COMPRESSED_COPY))
        async_copy.async_copy_global_to_shared(vals.slice(0, 256, dim=1),
                                               kv_ptr + rows[:, None] * COMPRESSED_ROW + cols[None, :])
        rows = _gathered_rows(ids, num_rows, gl.SliceLayout(1, COMPRESSED_SCALE_COPY))
        cols = gl.arange(0, 32, gl.SliceLayout(0, COMPRESSED_SCALE_COPY))
        async_copy.async_copy_global_to_shared(scales, kv_ptr + rows[:, None] * COMPRESSED_ROW + 256 + cols[None, :])


@gluon.jit
def _issue_block(blk, n_blocks, vals, scales, ids_ring, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                 b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr):
    """One commit group: block blk's rows (its index slots landed with the previous group) into ring slot blk % 2,
    and block blk + 1's index slots. Empty past the last block, so wait_group keeps counting blocks."""
    if blk < n_blocks:
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        ids = ids_ring.index(blk % 3)
        if in_a:
            _issue_rows(vals.index(blk % STAGES), scales.index(blk % STAGES), a_kv_ptr, ids, num_rows, A_FORMAT)
        else:
            _issue_rows(vals.index(blk % STAGES), scales.index(blk % STAGES), b_kv_ptr, ids, num_rows, B_FORMAT)
    _issue_ids(ids_ring, blk + 1, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows)
    async_copy.commit_group()


@gluon.jit
def _dequant_rows(raw_vals, raw_scales, tile, FORMAT: gl.constexpr):
    """Raw rows of a ring slot -> bf16 [64, 512] into `tile`, equal to cache_layout's unpack functions bit for bit."""
    if FORMAT == FP8_WINDOW:
        q = gl.convert_layout(gl.reshape(raw_vals.load(WINDOW_LOAD), [BLOCK_N, 16, 32]), WINDOW_GROUPS,
                              assert_trivial=True)
        e = raw_scales.slice(0, 16, dim=1).load(gl.SliceLayout(2, WINDOW_GROUPS))
        scale = (e.to(gl.int16) << 7).to(gl.bfloat16, bitcast=True)  # UE8M0 -> 2^(e-127) in bf16's exponent field
        x = q.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * scale[:, :, None]
        tile.store(gl.reshape(x, [BLOCK_N, D]))
    else:
        packed = gl.convert_layout(gl.reshape(raw_vals.slice(0, 256, dim=1).load(COMPRESSED_LOAD), [BLOCK_N, 32, 8]),
                                   COMPRESSED_GROUPS, assert_trivial=True)
        s = raw_scales.load(gl.SliceLayout(2, COMPRESSED_GROUPS)).to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)
        scale, packed = gl.broadcast(s[:, :, None], packed)
        even = gl.inline_asm_elementwise(_SCALED_LOW_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)
        odd = gl.inline_asm_elementwise(_SCALED_HIGH_PTX, "=r,=r,r,r,r", [packed, scale], dtype=gl.bfloat16,
                                        is_pure=True, pack=4)
        tile.store(gl.reshape(gl.join(even, odd), [BLOCK_N, D]))  # byte j -> dims 2j (low nibble), 2j + 1


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
    """Grid (s_q, h // 64), 8 warps. Source A's blocks, then source B's (if HAS_B; bf16 rows come alone); writes out
    bf16 [s_q, h, 512] and lse fp32 [s_q, h] (natural log, without the sink; -inf for a row with no valid slot)."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    a_ids_ptr += sq * stride_a_ids
    b_ids_ptr += sq * stride_b_ids
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, D], TILE_SHARED)
    ids_ring = gl.allocate_shared_memory(gl.int32, [3, BLOCK_N], IDS_SHARED)  # blocks blk, blk + 1, blk + 2 in use
    if A_FORMAT == BF16_ROWS:  # rows land in a 2-deep ring of tiles, no dequantization
        vals = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D], TILE_SHARED)
        scales = vals  # unused
    else:
        tile = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], TILE_SHARED)
        vals = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 512], RAW_SHARED)
        scales = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 32], RAW_SHARED)

    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, BF16_COPY))
    dims = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
    async_copy.async_copy_global_to_shared(q_smem, q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    _issue_ids(ids_ring, 0, n_blocks, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows)
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()  # block 0's index slots, copied by other threads, are readable
    _issue_block(0, n_blocks, vals, scales, ids_ring, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                 b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT)

    m_i = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_MMA))
    l_i = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_MMA))
    acc = gl.full([HEADS, D], 0.0, gl.float32, O_MMA)
    for blk in range(n_blocks):
        async_copy.wait_group(0)
        # every thread's copies of block blk (rows) and blk + 1 (index slots) have landed, and every warp is past
        # block blk - 1's MMAs (its tile is free) and its dequantization (its ring slot is free)
        gl.thread_barrier()
        _issue_block(blk + 1, n_blocks, vals, scales, ids_ring, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                     b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT)
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        if A_FORMAT == BF16_ROWS:
            kv = vals.index(blk % STAGES)
        else:
            kv = tile
            if in_a:
                _dequant_rows(vals.index(blk % STAGES), scales.index(blk % STAGES), tile, A_FORMAT)
            else:
                _dequant_rows(vals.index(blk % STAGES), scales.index(blk % STAGES), tile, B_FORMAT)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_MMA))
        ids = ids_ring.index(blk % 3).load(gl.SliceLayout(0, S_MMA))
        valid = (pos < ids_len) & (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
        fence_async_shared()  # the tile's generic-proxy writes before wgmma's async-proxy reads
        gl.thread_barrier()

        s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_MMA),
                          use_acc=False)
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_MMA))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_OPERAND)  # P rounded to bf16 before P.V, as the reference
        acc = warpgroup_mma(p_op, kv, acc)

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
