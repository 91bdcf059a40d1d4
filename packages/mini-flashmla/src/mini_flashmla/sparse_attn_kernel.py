"""Triton kernels of sparse MLA forward: one shared K=V head of 512, gathered rows, attention sink.

One program owns one query token and a block of up to 64 heads, and walks its index list in blocks of
BLOCK_N = 64 (the reference's online-softmax step). The index list has two sources, A then B, each with its own
row format, so the same kernel serves:

| call | source A | source B |
|---|---|---|
| `sparse_mla_fwd` | bf16 rows [n_kv, 512] | none |
| `sparse_mla_fwd_paged` | window ring, FP8 e4m3 + UE8M0/32 (528 B) | compressed KV, FP4 e2m1 + e4m3/16 (288 B) |

Quantized rows are dequantized in registers right after the gather (never written back to memory as bf16) and
equal cache_layout's unpack functions bit for bit (see dequant_triton).

Decode splits the index list over a third grid axis; each split writes a normalised partial output and its lse,
and `combine_splits_kernel` merges them (and applies the sink).

Everything runs in the log2 domain (exp2 is one instruction): scores are scaled by sm_scale * log2(e) and the
returned lse is converted back to natural log.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mini_flashmla.dequant_triton import e2m1_pairs_to_bf16, ue8m0_to_bf16

# Row formats of a source (the kernel's FORMAT constexprs).
FORMAT_BF16 = tl.constexpr(0)  # bf16 [n, 512]
FORMAT_FP8_WINDOW = tl.constexpr(1)  # cache_layout.pack_window_fp8, 528 B rows
FORMAT_FP4_COMPRESSED = tl.constexpr(2)  # cache_layout.pack_compressed_kv_fp4, 288 B rows

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_INIT = tl.constexpr(-1e30)  # the reference's initial running max: an all-empty block then adds exp(-inf) = 0


@triton.jit
def _load_kv_rows(base_ptr, rows, valid, FORMAT: tl.constexpr, D: tl.constexpr, FP4_ASM: tl.constexpr):
    """Gather `rows` (int64 [BLOCK_N]) of a cache and return them as bf16 [BLOCK_N, D]; invalid rows read as 0.

    Every load is a contiguous run of a row (values, then the small scale vector) so it vectorizes; the scales are
    broadcast over their group with a reshape instead of a per-element gather, which would need a 64-bit address
    per element and spill."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    if FORMAT == FORMAT_BF16:
        d = tl.arange(0, D)
        x = tl.load(base_ptr + rows[:, None] * D + d[None, :], mask=valid[:, None], other=0.0)
    elif FORMAT == FORMAT_FP8_WINDOW:
        row = base_ptr + rows[:, None] * 528
        q = tl.load(row + tl.arange(0, D)[None, :], mask=valid[:, None], other=0)
        e = tl.load(row + D + tl.arange(0, D // 32)[None, :], mask=valid[:, None], other=0)
        v = q.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        x = tl.reshape(tl.reshape(v, [BLOCK_N, D // 32, 32]) * ue8m0_to_bf16(e)[:, :, None], [BLOCK_N, D])
    else:  # FORMAT_FP4_COMPRESSED
        row = base_ptr + rows[:, None] * 288
        byte = tl.load(row + tl.arange(0, D // 2)[None, :], mask=valid[:, None], other=0)
        s = tl.load(row + D // 2 + tl.arange(0, D // 16)[None, :], mask=valid[:, None], other=0)
        scale = s.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)[:, :, None]  # one per 16 dims = 8 bytes
        even, odd = e2m1_pairs_to_bf16(tl.reshape(byte, [BLOCK_N, D // 16, 8]), scale, FP4_ASM)
        x = tl.interleave(tl.reshape(even, [BLOCK_N, D // 2]), tl.reshape(odd, [BLOCK_N, D // 2]))  # low nibble = even
    return x


@triton.jit
def _attend_source(q, m_i, l_i, acc, qk_scale_log2, ids_ptr, ids_len, num_rows, kv_ptr, blk_lo, blk_hi,
                   FORMAT: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, FP4_ASM: tl.constexpr):
    """Online softmax over index blocks [blk_lo, blk_hi) of one source; returns the updated (m, l, acc)."""
    for blk in range(blk_lo, blk_hi):
        pos = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        ids = tl.load(ids_ptr + pos, mask=pos < ids_len, other=-1)
        valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is treated as empty, like -1
        kv = _load_kv_rows(kv_ptr, ids.to(tl.int64), valid, FORMAT, D, FP4_ASM)
        s = tl.dot(q, tl.trans(kv)) * qk_scale_log2
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kv)  # P rounded to bf16 before P.V, as the reference
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def sparse_mla_fwd_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_num_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_num_rows,
    sink_ptr,
    out_ptr, stride_out_s, stride_out_h,
    lse_ptr, stride_lse_s,
    part_out_ptr, part_lse_ptr,
    num_heads, num_splits, blocks_per_split, qk_scale_log2,
    A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr, HAS_B: tl.constexpr, HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, FP4_ASM: tl.constexpr,
):
    """Grid (s_q, cdiv(h, BLOCK_H), num_splits). Without SPLIT writes out/lse (sink applied); with SPLIT writes
    partial (normalised out bf16, lse fp32) to part_out [s_q, num_splits, h, D] / part_lse [s_q, num_splits, h]."""
    sq = tl.program_id(0)
    sq_offset = sq.to(tl.int64)  # sq * stride_q_s (or stride_out_s) passes 2**31 from s_q = 65,536 at 64 heads
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    head_ok = heads < num_heads
    d = tl.arange(0, D)

    q = tl.load(q_ptr + sq_offset * stride_q_s + heads[:, None] * stride_q_h + d[None, :], mask=head_ok[:, None],
                other=0.0)
    m_i = tl.full([BLOCK_H], NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)

    # Logical blocks: A's blocks first, then B's; this split owns [lo, hi).
    a_blocks = tl.cdiv(a_len, BLOCK_N)
    lo = split * blocks_per_split
    hi = lo + blocks_per_split
    m_i, l_i, acc = _attend_source(q, m_i, l_i, acc, qk_scale_log2, a_ids_ptr + sq * stride_a_ids, a_len, a_num_rows,
                                   a_kv_ptr, lo, tl.minimum(hi, a_blocks), A_FORMAT, BLOCK_N, D, FP4_ASM)
    if HAS_B:
        b_blocks = tl.cdiv(b_len, BLOCK_N)
        m_i, l_i, acc = _attend_source(q, m_i, l_i, acc, qk_scale_log2, b_ids_ptr + sq * stride_b_ids, b_len,
                                       b_num_rows, b_kv_ptr, tl.maximum(lo - a_blocks, 0),
                                       tl.minimum(hi - a_blocks, b_blocks), B_FORMAT, BLOCK_N, D, FP4_ASM)

    has_mass = l_i > 0
    lse = tl.where(has_mass, (m_i + tl.log2(l_i)) * LN2, float("-inf"))
    if SPLIT:
        o = tl.where(has_mass[:, None], acc / l_i[:, None], 0.0)
        row = (sq * num_splits + split) * num_heads + heads
        tl.store(part_out_ptr + row.to(tl.int64)[:, None] * D + d[None, :], o.to(tl.bfloat16), mask=head_ok[:, None])
        tl.store(part_lse_ptr + row, lse, mask=head_ok)
    else:
        denom = l_i
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
            denom = denom + tl.exp2(sink * LOG2E - m_i)  # sink in the denominator only
        o = tl.where(denom[:, None] > 0, acc / denom[:, None], 0.0)
        tl.store(out_ptr + sq_offset * stride_out_s + heads[:, None] * stride_out_h + d[None, :], o.to(tl.bfloat16),
                 mask=head_ok[:, None])
        tl.store(lse_ptr + sq * stride_lse_s + heads, lse, mask=head_ok)


@triton.jit
def combine_splits_kernel(
    part_out_ptr, part_lse_ptr, sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    num_heads, num_splits,
    HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Grid (s_q, cdiv(h, BLOCK_H), D / BLOCK_D): out = sum_i exp(lse_i - lse) o_i with lse = logsumexp_i lse_i, then
    the sink rescales by exp(lse) / (exp(lse) + exp(sink)). Empty splits (lse_i = -inf) weigh 0; all empty gives 0,
    -inf. The head dim is cut into BLOCK_D columns per program, so that a small decode batch still has programs for
    every SM (batch 8, 64 heads: 128 programs instead of 32)."""
    sq = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for sp in range(num_splits):
        lse_i = tl.load(part_lse_ptr + (sq * num_splits + sp) * num_heads + heads, mask=head_ok, other=float("-inf"))
        m = tl.maximum(m, lse_i)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    w_sum = tl.zeros([BLOCK_H], tl.float32)
    for sp in range(num_splits):
        row = (sq * num_splits + sp) * num_heads + heads
        lse_i = tl.load(part_lse_ptr + row, mask=head_ok, other=float("-inf"))
        w = tl.exp2((lse_i - m_safe) * LOG2E)
        o_i = tl.load(part_out_ptr + row[:, None] * D + d[None, :], mask=head_ok[:, None], other=0.0)
        acc += w[:, None] * o_i
        w_sum += w
    has_mass = w_sum > 0
    lse = tl.where(has_mass, m_safe + tl.log(w_sum), float("-inf"))
    o = tl.where(has_mass[:, None], acc / w_sum[:, None], 0.0)
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
        o = o / (1.0 + tl.exp2((sink - lse) * LOG2E))[:, None]
    tl.store(out_ptr + sq * stride_out_s + heads[:, None] * stride_out_h + d[None, :], o.to(tl.bfloat16),
             mask=head_ok[:, None])
    if tl.program_id(2) == 0:
        tl.store(lse_ptr + sq * stride_lse_s + heads, lse, mask=head_ok)
