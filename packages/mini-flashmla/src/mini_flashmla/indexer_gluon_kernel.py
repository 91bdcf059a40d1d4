"""Gluon kernel of the indexer's dense scores over one shared key list (prefill; the FULL layers' indexers):
score[i, t] = bf16( sum_h bf16( relu(bf16(q_ih . k_t)) * w_ih ) ), as indexer_kernel.indexer_scores_kernel.

Why: the Triton kernel (session 13's 64-key tiles) reloads every query tile from L2 with plain loads that its loop
does not pipeline, and waits for each MMA before that tile's epilogue, so the tensor pipe idles under the loads and
the epilogue (Nsight Compute, session 17: 30.8% tensor, 52.5% issue). Here a CTA owns KEY_HALVES x 128 keys,
dequantized once into shared memory, and walks its queries four at a time (N = 4 x 32 heads = 128):
- each query tile [128 (query, head) rows, 128] bf16 arrives by TMA (two [128, 64] boxes: a 128-byte swizzle
  spans 64 bf16) into a QSTAGES-deep ring, issued as soon as its slot is free, so loads run ahead of the MMAs;
- work items are (query tile, key half) pairs; item n's MMA (A = the key half, B = the query tile, M 128 keys x
  N 128 columns x K 128, both warpgroups) is issued asynchronously before item n - 1's epilogue, so the tensor pipe
  works under the epilogue (one MMA in flight: two fp32 accumulators of 64 registers per thread);
- the epilogue rounds where the reference rounds, sums each query's 32 heads inside the accumulator's own layout
  (8 values per thread, then 2 shuffles across a lane quad), and stores fp32 scores key-contiguous.
Two key halves per CTA halve the query tiles' L2 traffic (each tile serves 256 keys).

Numerics: identical products and bf16 roundings to the Triton kernel (the 128-term dot products are exact in fp32,
see indexer_kernel.py); only the 32-head fp32 sum runs in another order, so a score can differ by one bf16 ulp, rarely.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from mini_flashmla.sparse_attn_gluon_kernel import _FP4_WORD_PTX, _bf16_halves

HEADS: gl.constexpr = gl.constexpr(32)  # V4.1's indexer heads
D: gl.constexpr = gl.constexpr(128)  # index head dim
KEYS: gl.constexpr = gl.constexpr(128)  # keys per MMA (its M side, two warpgroups of 64)
QUERIES: gl.constexpr = gl.constexpr(4)  # queries per MMA: N = QUERIES x HEADS = 128
COLS: gl.constexpr = gl.constexpr(128)
ROW_WORDS: gl.constexpr = gl.constexpr(17)  # a 68-byte key row: 16 words of e2m1 pairs, then 4 UE8M0 bytes

ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, 128, 16])
# ACC as [keys, query, head]: the same registers, lanes and warps (a linear layout): register bits give columns
# +1, rows +8, columns +8, +16 (heads), +32, +64 (queries); lane bits columns +2, +4, rows +1, +2, +4; warps rows
# +16, +32, +64. A query's 32 heads are then 8 registers of a thread times 4 lanes of a quad.
ACC3: gl.constexpr = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [8, 0, 0], [0, 0, 8], [0, 0, 16], [0, 1, 0], [0, 2, 0]],
    lane_bases=[[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0], [64, 0, 0]], block_bases=[], shape=[128, 4, 32])
SCORES: gl.constexpr = gl.SliceLayout(2, ACC3)  # [keys, queries] after the head sum
# key dequantization: [128 keys, 16 words], a thread's 4 words = 32 dims = one scale group
KEY_WORDS: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [8, 1], [1, 0])
K_SHARED: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
HALF_D: gl.constexpr = gl.constexpr(64)  # dims per TMA box and per MMA: one 128-byte swizzle span of bf16
FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
VIS_BOX: gl.constexpr = gl.constexpr(32)  # visible counts per TMA box: 128 bytes, a TMA destination's alignment


@gluon.jit
def _dequant_keys(cache_ptr, num_rows, key_rows_ptr, first, n_keys, k_smem):
    """Keys first .. first + 127 (rows from key_rows; -1, outside the cache or past n_keys: zeros) -> bf16 into
    k_smem, exactly cache_layout.unpack_index_k_fp4. Returns the row-valid mask [128] in the scores' layout."""
    t = first + gl.arange(0, KEYS, gl.SliceLayout(1, KEY_WORDS))
    rows = gl.load(key_rows_ptr + t, mask=t < n_keys, other=-1)
    ok = (rows >= 0) & (rows < num_rows)
    base = cache_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + gl.where(ok, rows, 0).to(gl.int64) * ROW_WORDS
    cols = gl.arange(0, 16, gl.SliceLayout(0, KEY_WORDS))
    words = gl.load(base[:, None] + cols[None, :], mask=ok[:, None], other=0)
    exps = gl.load(base + 16, mask=ok, other=0)
    e = (exps[:, None] >> (cols // 4 * 8)[None, :]) & 0xFF  # the thread's group's UE8M0 byte
    pair = (e << 7) * 0x10001  # 2^(e - 127) as a bf16x2 pair: bf16's exponent field
    d01, d23, d45, d67 = gl.inline_asm_elementwise(_FP4_WORD_PTX, "=r,=r,=r,=r,r,r", [words, pair],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
    halves = _bf16_halves(gl.join(gl.join(d01, d45), gl.join(d23, d67)))  # [..., i, j, h]: word 2i + j, half h
    k_smem.store(gl.reshape(halves, [KEYS, D]))
    return gl.convert_layout(ok, gl.SliceLayout(1, SCORES))


@gluon.jit
def _issue_queries(q_desc, w_desc, vis_desc, q_ring, w_ring, vis_ring, ready, tile, q_begin, QSTAGES: gl.constexpr):
    """TMA of query tile `tile` into ring slot tile % QSTAGES: its rows (q_begin + 4 tile) x 32 ... in two 64-dim
    halves (buffers 2 slot and 2 slot + 1), its head weights [4, 32] and its visible counts (a [1, 32] box)."""
    slot = tile % QSTAGES
    q0 = q_begin + tile * QUERIES
    bar = ready.index(slot)
    mbarrier.expect(bar, 2 * q_desc.block_type.nbytes + w_desc.block_type.nbytes + vis_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q0 * HEADS, 0], bar, q_ring.index(2 * slot))
    tma.async_copy_global_to_shared(q_desc, [q0 * HEADS, HALF_D], bar, q_ring.index(2 * slot + 1))
    tma.async_copy_global_to_shared(w_desc, [q0, 0], bar, w_ring.index(slot))
    tma.async_copy_global_to_shared(vis_desc, [0, q0], bar, vis_ring.index(slot))


@gluon.jit
def _scores_mma(k_half, q_ring, slot, zero):
    """Asynchronous [128 keys, 128 columns] = keys . queries^T over the two 64-dim halves (two wgmma groups)."""
    acc = warpgroup_mma(k_half.slice(0, HALF_D, dim=1), q_ring.index(2 * slot).permute((1, 0)), zero, use_acc=False,
                        is_async=True)
    return warpgroup_mma(k_half.slice(HALF_D, HALF_D, dim=1), q_ring.index(2 * slot + 1).permute((1, 0)), acc,
                         is_async=True)


@gluon.jit
def _epilogue(acc, row_ok, w_tile, vis_tile, first, q0, q_end, out_ptr, stride_out_s, n_keys):
    """Scores of keys first .. first + 127 against queries q0 .. q0 + 3 from the fp32 dot products acc [keys,
    (query, head)], rounded where the reference rounds; -inf for invalid rows and keys at or past visible[i].
    Stored from the reduction's layout (a lane quad holds the same sums: one of them stores; 8 keys a warp)."""
    w = w_tile._reinterpret(gl.bfloat16, [COLS], FLAT).load(gl.SliceLayout(0, ACC)).to(gl.float32)
    s = acc.to(gl.bfloat16).to(gl.float32)
    prod = (gl.maximum(s, 0.0) * w[None, :]).to(gl.bfloat16).to(gl.float32)
    prod = gl.convert_layout(gl.reshape(prod, [KEYS, QUERIES, HEADS]), ACC3, assert_trivial=True)
    score = gl.sum(prod, axis=2).to(gl.bfloat16).to(gl.float32)  # [keys, queries] in SCORES
    t = first + gl.arange(0, KEYS, gl.SliceLayout(1, SCORES))
    qi = q0 + gl.arange(0, QUERIES, gl.SliceLayout(0, SCORES))
    visible = vis_tile._reinterpret(gl.int32, [VIS_BOX], FLAT).slice(0, QUERIES).load(gl.SliceLayout(0, SCORES))
    score = gl.where(row_ok[:, None] & (t[:, None] < visible[None, :]), score, float("-inf"))
    gl.store(out_ptr + qi.to(gl.int64)[None, :] * stride_out_s + t[:, None], score,
             mask=(t < n_keys)[:, None] & (qi < q_end)[None, :])


@gluon.jit
def indexer_scores_gluon_kernel(
    q_desc, w_desc, vis_desc, cache_ptr, num_rows, key_rows_ptr, out_ptr, stride_out_s, s_q, n_keys,
    queries_per_program,
    KEY_HALVES: gl.constexpr, QSTAGES: gl.constexpr,
):
    """Grid (cdiv(n_keys, KEY_HALVES * 128), cdiv(s_q, queries_per_program)); num_warps=8; queries_per_program a
    multiple of 4. q_desc: bf16 [s_q * 32, 128] (q's rows, FP4 fake-quantized, RoPE applied) in [128, 64] boxes;
    w_desc: bf16 [s_q, 32] head weights in [4, 32] boxes; vis_desc: int32 [1, s_q] visible counts in [1, 32] boxes
    (both unswizzled; a TMA destination is 128-byte aligned, so a ring slot of visible counts holds 32, of which
    the tile uses 4); cache uint8 [num_rows, 68]; key_rows int32 [n_keys] (shared by every query); out fp32
    [s_q, n_keys] (row stride stride_out_s)."""
    first = gl.program_id(0) * (KEY_HALVES * KEYS)
    q_begin = gl.program_id(1) * queries_per_program
    q_end = gl.minimum(q_begin + queries_per_program, s_q)
    tiles = gl.cdiv(q_end - q_begin, QUERIES)

    q_ring = gl.allocate_shared_memory(gl.bfloat16, [2 * QSTAGES, COLS, HALF_D], q_desc.layout)
    w_ring = gl.allocate_shared_memory(gl.bfloat16, [QSTAGES, QUERIES, HEADS], w_desc.layout)
    vis_ring = gl.allocate_shared_memory(gl.int32, [QSTAGES, 1, VIS_BOX], vis_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [QSTAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(QSTAGES):
        mbarrier.init(ready.index(s), count=1)
    for s in gl.static_range(QSTAGES):
        if s < tiles:
            _issue_queries(q_desc, w_desc, vis_desc, q_ring, w_ring, vis_ring, ready, s, q_begin, QSTAGES)

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [KEY_HALVES, KEYS, D], K_SHARED)
    row_ok0 = _dequant_keys(cache_ptr, num_rows, key_rows_ptr, first, n_keys, k_smem.index(0))
    row_ok1 = row_ok0
    if KEY_HALVES == 2:
        row_ok1 = _dequant_keys(cache_ptr, num_rows, key_rows_ptr, first + KEYS, n_keys, k_smem.index(1))
    fence_async_shared()
    gl.thread_barrier()  # every thread's keys are in shared memory before the MMAs read them

    zero = gl.full([KEYS, COLS], 0.0, gl.float32, ACC)
    items = tiles * KEY_HALVES
    # item n = (query tile n // KEY_HALVES, key half n % KEY_HALVES); item 0's MMA before the loop
    mbarrier.wait(ready.index(0), 0)
    prev = _scores_mma(k_smem.index(0), q_ring, 0, zero)
    for n in range(1, items + 1):
        if n < items:
            tile = n // KEY_HALVES
            slot = tile % QSTAGES
            mbarrier.wait(ready.index(slot), (tile // QSTAGES) & 1)
            cur = _scores_mma(k_smem.index(n % KEY_HALVES), q_ring, slot, zero)
            acc = warpgroup_mma_wait(2, deps=(prev,))  # item n - 1's MMAs are done, item n's two groups run on
        else:
            cur = prev
            acc = warpgroup_mma_wait(0, deps=(prev,))
        done = n - 1
        done_tile = done // KEY_HALVES
        half = done % KEY_HALVES
        done_slot = done_tile % QSTAGES
        _epilogue(acc, gl.where(half == 0, row_ok0, row_ok1), w_ring.index(done_slot), vis_ring.index(done_slot),
                  first + half * KEYS, q_begin + done_tile * QUERIES, q_end, out_ptr, stride_out_s, n_keys)
        if half == KEY_HALVES - 1:  # the tile's last MMA and epilogue have read its slot: refill it
            gl.thread_barrier()  # every warpgroup is past its wait and its reads of the slot
            if done_tile + QSTAGES < tiles:
                _issue_queries(q_desc, w_desc, vis_desc, q_ring, w_ring, vis_ring, ready, done_tile + QSTAGES,
                               q_begin, QSTAGES)
        prev = cur
    for s in gl.static_range(QSTAGES):
        mbarrier.invalidate(ready.index(s))
