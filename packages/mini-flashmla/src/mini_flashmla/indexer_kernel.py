"""Triton kernels of the indexer score: score[i, t] = bf16( sum_h bf16( relu(bf16(q_ih . k_t)) * w_ih ) ).

Keys come straight from the packed index-key cache (68 B rows: 64 B of e2m1 pairs, 4 B of UE8M0 exponents,
one per 32 dims). A program dequantizes its keys to bf16 once and reuses them for a run of queries, BLOCK_Q
queries x H heads per MMA, keys as the M side: [BLOCK_K, 128] x [128, BLOCK_Q * H]. Heads on the N side keep
each query's head sum inside one warpgroup's accumulator, where a second MMA takes it (`_score_tile`).

Bit-exactness: q and k are FP4 values times powers of two, so every product has at most 4 significant bits; a
32-dim group's sum needs at most 13 bits, and the 128-term dot product is exact in fp32 whatever the summation
order as long as the four groups' scale products lie within ~10 binades of each other (true for the random
test data; a normed activation rarely spreads further). The bf16 roundings then happen at the same
points as the reference. Only the final 32-term head sum (fp32, then bf16) can round differently from torch's
summation order, by at most one bf16 ulp and rarely.

The epilogue (session 32, docs/reports/flashmla-indexer.md): the kernels were bound by it, ~7 instructions per
(key, query, head) element (two bf16 round trips, relu, an fp32 multiply, the head sum across lanes) beside 256 MMA
FLOPs. Now the dot product is rounded by the packed convert, relu and the weight run on bf16 pairs, and the head sum
is a second MMA; offline (triton 3.6, sm_90a) a loop step of the shared-key kernel went from 13.2 to 4.5 issued
instructions per score (the shipped launches before and after).
"""

from __future__ import annotations

import triton
import triton.language as tl

from mini_flashmla.dequant_triton import e2m1_pairs_to_bf16, ue8m0_to_bf16

INDEX_K_ROW_BYTES = tl.constexpr(68)
# relu, then the head weight, on bf16 pairs: the product of two bf16 values is exact in fp32, so rounding it once is
# the reference's bf16(fp32(relu) * fp32(w))
RELU_TIMES_WEIGHT_PTX = tl.constexpr("{ .reg .b32 z, r; mov.b32 z, 0; max.bf16x2 r, $1, z; mul.rn.bf16x2 $0, r, $2; }")


@triton.jit
def _dequant_keys(cache_ptr, num_rows, rows, D: tl.constexpr, ASM: tl.constexpr):
    """(bf16 [BLOCK_K, D] keys of cache rows `rows` (int32 [BLOCK_K]), row_ok): rows that are -1 or outside the cache
    read nothing and give zeros. ASM: the inline-PTX e2m1 decode (CUDA), else the integer one (any backend)."""
    BLOCK_K: tl.constexpr = rows.shape[0]
    row_ok = (rows >= 0) & (rows < num_rows)
    row = cache_ptr + rows.to(tl.int64)[:, None] * INDEX_K_ROW_BYTES
    byte = tl.load(row + tl.arange(0, D // 2)[None, :], mask=row_ok[:, None], other=0)
    e = tl.load(row + D // 2 + tl.arange(0, D // 32)[None, :], mask=row_ok[:, None], other=0)
    scale = ue8m0_to_bf16(e)[:, :, None]  # one per 32 dims = 16 bytes
    even, odd = e2m1_pairs_to_bf16(tl.reshape(byte, [BLOCK_K, D // 32, 16]), scale, ASM)
    return tl.interleave(tl.reshape(even, [BLOCK_K, D // 2]), tl.reshape(odd, [BLOCK_K, D // 2])), row_ok  # low = even


@triton.jit
def _score_tile(k, q, w, BLOCK_Q: tl.constexpr, H: tl.constexpr, ASM: tl.constexpr):
    """bf16-valued fp32 scores [BLOCK_K, BLOCK_Q] of keys k [BLOCK_K, D] against q [BLOCK_Q * H, D] with head
    weights w (bf16 [BLOCK_Q * H]), rounded to bf16 where the reference rounds. ASM: relu and the weight in packed
    bf16 (CUDA), else in fp32 (the interpreter; the same values).
    The head sum is a second MMA: the weighted products P [BLOCK_K, BLOCK_Q * H] (bf16, in the first MMA's
    accumulator registers, which are the second's A fragment when one warpgroup holds whole rows) times a 0/1 matrix
    whose column j sums query j's heads. Each product is exact (x 1.0), so only the sum's order differs from the
    reference's fp32 sum, as before (the tensor core adds a step's 16 terms at once)."""
    tl.static_assert(BLOCK_Q <= 16, "the head-sum MMA has 16 columns, one per query")
    s = tl.dot(k, tl.trans(q)).to(tl.bfloat16)  # [BLOCK_K, BLOCK_Q * H], per-head bf16 rounding
    w = tl.broadcast_to(w[None, :], s.shape)
    if ASM:
        prod = tl.inline_asm_elementwise(RELU_TIMES_WEIGHT_PTX, "=r,r,r", [s, w], dtype=tl.bfloat16, is_pure=True,
                                         pack=2)
    else:
        prod = (tl.maximum(s.to(tl.float32), 0.0) * w.to(tl.float32)).to(tl.bfloat16)
    column = tl.arange(0, 16)  # the MMA's smallest N; columns past BLOCK_Q sum nothing (exact zeros)
    heads_of = ((tl.arange(0, BLOCK_Q * H) // H)[:, None] == column[None, :]).to(tl.bfloat16)
    total = tl.dot(prod, heads_of)  # fp32 [BLOCK_K, 16]
    total = tl.sum(tl.reshape(total, [k.shape[0], 16 // BLOCK_Q, BLOCK_Q]), 1)  # query j's column plus zeros
    return total.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _sequence_program(pid, query_starts_ptr, n_seqs, queries_per_program, SEQS: tl.constexpr):
    """A ragged batch's program pid, when each of its n_seqs sequences (queries query_starts[b] ..
    query_starts[b + 1] - 1, int64 [n_seqs + 1]) has cdiv(its queries, queries_per_program) programs, in sequence
    order: (its sequence b, first query, end query). SEQS: a power of two >= n_seqs. A program past the last
    sequence's gets b >= n_seqs and an empty range."""
    b_ids = tl.arange(0, SEQS)
    live = b_ids < n_seqs
    lo = tl.load(query_starts_ptr + b_ids, mask=live, other=0).to(tl.int32)
    hi = tl.load(query_starts_ptr + b_ids + 1, mask=live, other=0).to(tl.int32)
    programs = (hi - lo + queries_per_program - 1) // queries_per_program
    ends = tl.cumsum(programs, 0)
    b = tl.sum((ends <= pid).to(tl.int32), 0)
    this = b_ids == b
    first = tl.sum(tl.where(this, ends - programs, 0), 0)
    q_begin = tl.sum(tl.where(this, lo, 0), 0) + (pid - first) * queries_per_program
    return b, q_begin, tl.minimum(q_begin + queries_per_program, tl.sum(tl.where(this, hi, 0), 0))


@triton.jit
def _sequence_of_query(i, query_starts_ptr, n_seqs, SEQS: tl.constexpr):
    """The sequence b of query i in a ragged batch (query_starts as in _sequence_program): the number of sequences
    that end at or before i."""
    b_ids = tl.arange(0, SEQS)
    live = b_ids < n_seqs
    hi = tl.load(query_starts_ptr + b_ids + 1, mask=live, other=0)
    return tl.sum(((hi <= i) & live).to(tl.int32), 0)


@triton.jit
def indexer_scores_kernel(
    q_ptr, stride_q_s, stride_q_h,
    w_ptr, stride_w_s,
    cache_ptr, num_rows,
    key_rows_ptr, stride_key_rows_s,
    visible_ptr,
    out_ptr, stride_out_s,
    s_q, n_keys, queries_per_program,
    query_starts_ptr, n_seqs,
    H: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
    SEQS: tl.constexpr,
):
    """Grid (cdiv(n_keys, BLOCK_K), cdiv(s_q, queries_per_program) (+ n_seqs for SEQS > 0)). Each program dequantizes its BLOCK_K keys once
    and scores them against queries_per_program queries, BLOCK_Q per MMA (dequantizing is the expensive part, the
    queries are cheap bf16 loads). key_rows int32 [*, n_keys]: stride_key_rows_s is 0 when all queries share one
    key list and the row stride when each query has its own (then queries_per_program = BLOCK_Q = 1; the API
    launches indexer_scores_per_query_kernel for that). A key scores -inf when its row id is -1 / outside the cache
    or t >= visible[i]. One warpgroup must hold whole key rows for the head-sum MMA, and Triton lays an M = 64 MMA
    on 8 warps as two N halves, so the API launches 4 warps (128 keys: two m64 MMAs on the one warpgroup).
    SEQS > 0: a ragged batch of n_seqs sequences (a power of two >= n_seqs), sequence b's queries query_starts[b] ..
    query_starts[b + 1] - 1 scored against its own key list, row b of key_rows (row stride stride_key_rows_s); each
    sequence gets its own runs of query tiles (_sequence_program), so a program's keys serve only its sequence, and
    a query's scores are those of a launch with its sequence alone: the same tiles' products and sums per key."""
    t = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    if SEQS > 0:
        b, q_begin, q_end = _sequence_program(tl.program_id(1), query_starts_ptr, n_seqs, queries_per_program, SEQS)
        t_ok = t < tl.where(b < n_seqs, n_keys, 0)  # a program past the last sequence's reads no key
        key_list = b.to(tl.int64) * stride_key_rows_s
    else:
        q_begin = tl.program_id(1) * queries_per_program
        t_ok = t < n_keys
        key_list = q_begin * stride_key_rows_s

    rows = tl.load(key_rows_ptr + key_list + t, mask=t_ok, other=-1)
    # Integer decode (ASM False): each key is decoded once for a run of queries, so its cost is not the kernel's.
    k, row_ok = _dequant_keys(cache_ptr, num_rows, rows, D, False)

    # Columns of the N side: (query, head) pairs.
    col = tl.arange(0, BLOCK_Q * H)
    d = tl.arange(0, D)
    if SEQS == 0:
        q_end = tl.minimum(q_begin + queries_per_program, s_q)
    for q0 in range(q_begin, q_end, BLOCK_Q):
        col_q = q0 + col // H
        col_ok = col_q < q_end
        q = tl.load(q_ptr + col_q[:, None] * stride_q_s + (col % H)[:, None] * stride_q_h + d[None, :],
                    mask=col_ok[:, None], other=0.0)
        w = tl.load(w_ptr + col_q * stride_w_s + col % H, mask=col_ok, other=0.0)
        score = _score_tile(k, q, w, BLOCK_Q, H, ASM)

        qi = q0 + tl.arange(0, BLOCK_Q)
        qi_ok = qi < q_end
        visible = tl.load(visible_ptr + qi, mask=qi_ok, other=0)
        seen = row_ok[:, None] & (t[:, None] < visible[None, :])
        score = tl.where(seen, score, float("-inf"))
        tl.store(out_ptr + qi[None, :].to(tl.int64) * stride_out_s + t[:, None], score,
                 mask=t_ok[:, None] & qi_ok[None, :])


@triton.jit
def indexer_scores_per_query_kernel(
    q_ptr, stride_q_s, stride_q_h, w_ptr, stride_w_s, cache_ptr, num_rows, key_rows_ptr, stride_key_rows_s,
    blocks_ptr, stride_blocks_s, visible_ptr, out_ptr, stride_out_s, n_columns, n_keys, keys_per_program,
    query_starts_ptr, n_seqs,
    H: tl.constexpr, D: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr,
    GROUP: tl.constexpr, SEQS: tl.constexpr,
):
    """The per-query case of indexer_scores_kernel (decode: each query its own key list, key_rows int32
    [s_q, n_keys] with row stride stride_key_rows_s; 0 shares one list). Grid (s_q, cdiv(n_columns,
    keys_per_program)): the queries on the x axis, where CUDA allows 2^31 - 1 programs (65,535 on y). A program
    loads its query and head weights once and walks keys_per_program columns in BLOCK_K tiles (their loads
    software-pipelined STAGES deep; 1 measured best, the other programs on the SM hide the latency).
    Column c of a query scores logical key c (GROUP = 0), or, for a REINDEX layer's candidate blocks (blocks int32
    [s_q, n_columns / GROUP], -1 = none), key blocks[i, c // GROUP] * GROUP + c % GROUP: one more load per key, of
    its row id, instead of scoring every key. Keys at or past visible[i] or n_keys are not read (their row ids
    load as -1). Session 15 run 2 measured this grid at 0.235 / 0.912 ms (batch 64 / 256, 65,536 keys each; the
    axes the other way round: 0.270 / 0.900). Same scores, bit for bit, as indexer_scores_kernel with BLOCK_Q = 1:
    the same products and sums per key.
    Why a kernel of its own: indexer_scores_kernel's per-query launch (one program per query and 128 keys) reloaded
    the query (8 KB) for every 8.7 KB of keys and decoded e2m1 with integer ops, which pays when a key serves a run of
    queries but not here (one query per key). It read keys at 0.38 TB/s; this kernel with the inline-PTX decode
    reads them at 1.06-1.27 TB/s, 2.8-3.3x faster at batch 64 / 256 with 65,536 keys each (session 14 run 4,
    benchmarks/exp_indexer_tiles.py --per-query; the integer decode alone in this kernel: 0.32-0.43 TB/s).
    """
    i = tl.program_id(0).to(tl.int64)
    # SEQS > 0: a ragged batch (see indexer_scores_kernel), query i reads its sequence's key list
    key_list = _sequence_of_query(i, query_starts_ptr, n_seqs, SEQS).to(tl.int64) if SEQS > 0 else i
    first = tl.program_id(1) * keys_per_program
    h = tl.arange(0, H)
    q = tl.load(q_ptr + i * stride_q_s + h[:, None] * stride_q_h + tl.arange(0, D)[None, :])
    w = tl.load(w_ptr + i * stride_w_s + h)
    visible = tl.minimum(tl.load(visible_ptr + i), n_keys)
    end = tl.minimum(first + keys_per_program, n_columns)
    for start in tl.range(first, end, BLOCK_K, num_stages=STAGES):
        c = start + tl.arange(0, BLOCK_K)
        c_ok = c < end
        if GROUP == 0:
            t = c
        else:
            blk = tl.load(blocks_ptr + i * stride_blocks_s + c // GROUP, mask=c_ok, other=-1)
            t = tl.where(blk >= 0, blk * GROUP + c % GROUP, visible)  # a -1 block: a key nobody sees
        rows = tl.load(key_rows_ptr + key_list * stride_key_rows_s + t, mask=c_ok & (t < visible), other=-1)
        k, row_ok = _dequant_keys(cache_ptr, num_rows, rows, D, ASM)
        score = tl.reshape(_score_tile(k, q, w, 1, H, ASM), [BLOCK_K])
        tl.store(out_ptr + i * stride_out_s + c, tl.where(row_ok, score, float("-inf")), mask=c_ok)
