"""Gluon kernel of sparse MLA prefill over the paged quantized cache (FP8 window rows, FP4 compressed rows).

Why: the Triton kernel (sparse_attn_kernel.py) spends ~11 us per 64-slot block against ~1 us of tensor-core work
(docs/reports/flashmla-sparse-attention.md): Triton lays the 64 x 64 QK^T MMA out over both warpgroups with the same
rows (the QK half of the FLOPs done twice), keeps the gathered rows in registers across the dequantization (255
registers and spills), and cannot overlap the next block's gather with this block's math. Gluon lets the kernel state
the schedule:

- One CTA of two warpgroups per query token and 64 heads. Q [64, 512] bf16 sits in shared memory for the whole walk.
- The raw bytes of block i + 1 (64 rows of 528 or 288 B, gathered by row id) stream into a 2-deep shared-memory ring
  by cp.async while block i is computed.
- Block i's rows are dequantized shared -> registers -> shared once, by all 256 threads, into a bf16 tile
  [64 slots, 512] (128 B swizzle), which is both the K operand (permuted view) and the V operand of wgmma.
- S = Q K^T as one wgmma per warpgroup on 32 of the 64 slots (no duplicated rows), the softmax's row max and sum
  reduced across the two warpgroups, P rounded to bf16 and handed to the PV wgmma from registers, each warpgroup
  owning 256 of the 512 output columns (a 128-register fp32 accumulator per thread).

Numerics are the Triton kernel's (and the reference's): blocks of 64 slots in order (window, then compressed), the
running max from -1e30 in the log2 domain, P rounded to bf16 before P.V, the sink in the denominator only, lse
without the sink. The dequantized values are the same bits (every value has at most 6 significant bits, so the
scale multiply is exact in bf16).

Empty slots (-1, or an id outside the cache) gather row 0 of their cache (any valid row: their score is -inf, so P
is exactly 0 and the finite values add nothing); a source with no rows is never routed here.

Shared memory: Q 64 KB + bf16 tile 64 KB + 2 x (32 KB values + 2 KB scales) = 196 KB, one CTA per SM.
"""

from __future__ import annotations

from mini_deepgemm.gemm_gluon_kernel import _SCALED_HIGH_PTX, _SCALED_LOW_PTX
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

# Row formats (the values of sparse_attn_kernel's FORMAT_* constants) and their byte layouts (cache_layout.py).
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
# cp.async of a block's values: 16 B per copy; a window row is 32 copies, a compressed row 16.
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
Q_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])  # [64, 512] bf16, 16 B per copy


@gluon.jit
def _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr, b_len, b_rows):
    """Logical block -> (ids pointer of its query row, ids length, cache rows, block within its source)."""
    in_a = blk < a_blocks
    ids_ptr = gl.where(in_a, a_ids_ptr, b_ids_ptr)
    ids_len = gl.where(in_a, a_len, b_len)
    num_rows = gl.where(in_a, a_rows, b_rows)
    local = gl.where(in_a, blk, blk - a_blocks)
    return in_a, ids_ptr, ids_len, num_rows, local


@gluon.jit
def _gathered_rows(ids_ptr, ids_len, num_rows, local, layout: gl.constexpr):
    """int64 [64] row ids of a block in `layout`; empty slots read row 0 (see the module docstring)."""
    pos = local * BLOCK_N + gl.arange(0, BLOCK_N, layout)
    ids = gl.load(ids_ptr + pos, mask=pos < ids_len, other=-1)
    return gl.where((ids >= 0) & (ids < num_rows), ids, 0).to(gl.int64)


@gluon.jit
def _issue_rows(raw_vals, raw_scales, kv_ptr, ids_ptr, ids_len, num_rows, local, FORMAT: gl.constexpr):
    """cp.async one block's raw rows (values, then scales) of a source into a ring slot."""
    if FORMAT == FP8_WINDOW:
        rows = _gathered_rows(ids_ptr, ids_len, num_rows, local, gl.SliceLayout(1, WINDOW_COPY))
        cols = gl.arange(0, 512, gl.SliceLayout(0, WINDOW_COPY))
        async_copy.async_copy_global_to_shared(raw_vals, kv_ptr + rows[:, None] * WINDOW_ROW + cols[None, :])
        rows = _gathered_rows(ids_ptr, ids_len, num_rows, local, gl.SliceLayout(1, WINDOW_SCALE_COPY))
        cols = gl.arange(0, 16, gl.SliceLayout(0, WINDOW_SCALE_COPY))
        async_copy.async_copy_global_to_shared(raw_scales.slice(0, 16, dim=1),
                                               kv_ptr + rows[:, None] * WINDOW_ROW + 512 + cols[None, :])
    else:
        rows = _gathered_rows(ids_ptr, ids_len, num_rows, local, gl.SliceLayout(1, COMPRESSED_COPY))
        cols = gl.arange(0, 256, gl.SliceLayout(0, COMPRESSED_COPY))
        async_copy.async_copy_global_to_shared(raw_vals.slice(0, 256, dim=1),
                                               kv_ptr + rows[:, None] * COMPRESSED_ROW + cols[None, :])
        rows = _gathered_rows(ids_ptr, ids_len, num_rows, local, gl.SliceLayout(1, COMPRESSED_SCALE_COPY))
        cols = gl.arange(0, 32, gl.SliceLayout(0, COMPRESSED_SCALE_COPY))
        async_copy.async_copy_global_to_shared(raw_scales, kv_ptr + rows[:, None] * COMPRESSED_ROW + 256 + cols[None, :])


@gluon.jit
def _issue_block(blk, n_blocks, raw_vals, raw_scales, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                 b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr):
    """cp.async logical block `blk` into ring slot blk % STAGES as one commit group (empty past the last block, so
    wait_group keeps counting blocks)."""
    if blk < n_blocks:
        slot = blk % STAGES
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        if in_a:
            _issue_rows(raw_vals.index(slot), raw_scales.index(slot), a_kv_ptr, ids_ptr, ids_len, num_rows, local,
                        A_FORMAT)
        else:
            _issue_rows(raw_vals.index(slot), raw_scales.index(slot), b_kv_ptr, ids_ptr, ids_len, num_rows, local,
                        B_FORMAT)
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


@gluon.jit
def sparse_mla_fwd_paged_gluon_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_rows,
    sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    qk_scale_log2,
    A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr, HAS_B: gl.constexpr, HAS_SINK: gl.constexpr,
):
    """Grid (s_q, h // 64), 8 warps. Source A's blocks, then source B's (if HAS_B); writes out bf16 [s_q, h, 512]
    and lse fp32 [s_q, h] (natural log, without the sink; -inf for a row with no valid slot)."""
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    a_ids_ptr += sq * stride_a_ids
    b_ids_ptr += sq * stride_b_ids
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, D], TILE_SHARED)
    tile = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], TILE_SHARED)
    raw_vals = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 512], RAW_SHARED)
    raw_scales = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 32], RAW_SHARED)

    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_COPY))
    dims = gl.arange(0, D, gl.SliceLayout(0, Q_COPY))
    async_copy.async_copy_global_to_shared(q_smem, q_ptr + sq * stride_q_s + heads[:, None] * stride_q_h + dims[None, :])
    for blk in gl.static_range(STAGES - 1):  # Q joins block 0's commit group
        _issue_block(blk, n_blocks, raw_vals, raw_scales, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                     b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT)

    m_i = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_MMA))
    l_i = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_MMA))
    acc = gl.full([HEADS, D], 0.0, gl.float32, O_MMA)
    for blk in range(n_blocks):
        async_copy.wait_group(STAGES - 2)
        # every thread's copies of block blk have landed, and every warp is past block blk - 1's MMAs (the tile is
        # free) and its dequantization (its ring slot is free)
        gl.thread_barrier()
        _issue_block(blk + STAGES - 1, n_blocks, raw_vals, raw_scales, a_blocks, a_kv_ptr, a_ids_ptr, a_len, a_rows,
                     b_kv_ptr, b_ids_ptr, b_len, b_rows, A_FORMAT, B_FORMAT)
        slot = blk % STAGES
        in_a, ids_ptr, ids_len, num_rows, local = _block_source(blk, a_blocks, a_ids_ptr, a_len, a_rows, b_ids_ptr,
                                                                b_len, b_rows)
        if in_a:
            _dequant_rows(raw_vals.index(slot), raw_scales.index(slot), tile, A_FORMAT)
        else:
            _dequant_rows(raw_vals.index(slot), raw_scales.index(slot), tile, B_FORMAT)
        fence_async_shared()  # the tile's generic-proxy stores before wgmma's async-proxy reads
        gl.thread_barrier()

        s = warpgroup_mma(q_smem, tile.permute((1, 0)), gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_MMA),
                          use_acc=False)
        pos = local * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_MMA))
        ids = gl.load(ids_ptr + pos, mask=pos < ids_len, other=-1)
        valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_MMA))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_OPERAND)  # P rounded to bf16 before P.V, as the reference
        acc = warpgroup_mma(p_op, tile, acc)

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
