"""Gluon kernel of the dense FP8 GEMM of the V4.1 recipe at decode sizes (M <= 64 rows): the weights stream through
a TMA ring as the MMA's A operand (swap-AB) and K is split into fixed slices, each program one slice of 128 weight
rows, the slices' fp32 partial sums added in a fixed order by a second kernel.

Why (docs/reports/deepgemm-v41-splitk.md): at one GPU's decode batch the dense projections (wq_a, wkv, wo_b, the
indexer's wq_b, the shared expert) went through fp8_gemm_v41_kernel's 64 x 32 tiles, one program per 32 weight rows
and all of K: 16 programs for wkv (N = 512), 160 for wo_b (N = 5,120, K = 8,192), each a serial chain of MMA, wait
and promote over every K block. Those GEMMs read their weights at ~0.22 of the device copy rate (session 41's decode
profile: 95 us per layer for ~90 MB). Every program also read the whole [64, K] activation tile for its 32 weight
rows: twice the weight bytes again from L2.

How: program (n, s) of grid (N / 128, splits) reads weight rows [128 n, 128 n + 128) and K steps [s x slice_steps,
..) (a step is K = 128) by TMA into a STAGES-deep ring together with the step's [BLOCK_T, 128] activation tile
(rows past M read as zeros). Per step and per 32 of K, two m64nBLOCK_Tk32 MMAs (weight rows 0-63 and 64-127 as A
from shared memory, the tokens as B) into fresh fp32 tiles, one wait, then acc += part * (sa[t, kb] * sb[n / 32,
kb]) per element: fp8_gemm_v41_kernel's promotion, with its operands' roles swapped (the H200 gives an FP8 MMA's
element the same bits in either role: tests/test_gemm_gluon_v41.py checks one split against the 64 x 32 tiles).
With one slice the program rounds its tile to bf16 and stores the used tokens; with more it stores fp32 partial
sums [splits, M, N] and splitk_sum_kernel adds them in ascending slice order: ((p0 + p1) + p2) + ....

Batch invariance: the slices are a function of (N, K) alone (gemm._splitk_slices), and neither the token tile nor
the row count changes an element's operations, so a row's bits do not depend on the rows beside it in the call.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .gemm_gluon_fp8_kernel import _ue8m0_to_f32


@gluon.jit
def _issue(w_desc, x_desc, w_ring, x_ring, ready, i, k, n0):
    """TMA K step k's weight rows [n0, n0 + 128) and activations [0, BLOCK_T) into ring slot i % STAGES."""
    slot = i % w_ring.type.shape[0]
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(w_desc, [n0, k * 128], ready.index(slot), w_ring.index(slot))
    tma.async_copy_global_to_shared(x_desc, [0, k * 128], ready.index(slot), x_ring.index(slot))


@gluon.jit
def _store_rows(acc, d_ptr, rows, tokens, M, stride_d, SPLIT: gl.constexpr):
    """acc fp32 [64 weight rows, BLOCK_T tokens] -> d[token, row] for tokens < M: bf16 (one slice) or fp32 (a
    partial-sum slab)."""
    out = d_ptr + tokens.to(gl.int64)[None, :] * stride_d + rows[:, None]
    keep = (tokens < M)[None, :]
    if SPLIT:
        gl.store(out, acc, mask=keep)
    else:
        gl.store(out, acc.to(gl.bfloat16), mask=keep)


@gluon.jit
def fp8_gemm_v41_splitk_kernel(w_desc, x_desc, d_ptr, sa_ptr, sb_ptr, M, N, K, slice_steps, stride_sa, stride_sb,
                               stride_d, STAGES: gl.constexpr, SPLIT: gl.constexpr):
    """d[m, n] = sum over 32-blocks kb of sa[m, kb] * sb[n // 32, kb] * (x[m, kb] . w[n, kb]).
    w_desc: e4m3 [N, K] in [128, 128] boxes; x_desc: e4m3 [M, K] in [BLOCK_T, 128] boxes (BLOCK_T 16, 32 or 64 >=
    M); sa_ptr: int32 view of the UE8M0 bytes [M, K / 32] (four scales per word, row stride stride_sa words);
    sb_ptr: the same of [N / 32, K / 32]; N % 128 == 0, K % 128 == 0. Grid (N / 128, splits), program (n, s) takes
    K steps [s * slice_steps, min((s + 1) * slice_steps, K / 128)). SPLIT false (one slice): d bf16 [M, N], row
    stride stride_d; SPLIT: d fp32 [splits, M, N] (contiguous; stride_d = N), program s writing slab s.
    num_warps=4 (one warpgroup)."""
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 128], w_desc.layout)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_T, 128], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    n0 = gl.program_id(0) * 128
    split = gl.program_id(1)
    k0 = split * slice_steps
    num_k = gl.minimum(slice_steps, K // 128 - k0)
    for i in gl.static_range(STAGES - 1):
        if i < num_k:
            _issue(w_desc, x_desc, w_ring, x_ring, ready, i, k0 + i, n0)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 32])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    tokens = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, mma))
    # tokens past M read row M - 1's scales (their outputs are not stored); a thread's two rows share a 32-row block
    sa_rows = sa_ptr + gl.minimum(tokens, M - 1) * stride_sa + k0
    sb_lo = sb_ptr + ((n0 + rows) // 32) * stride_sb + k0
    sb_hi = sb_ptr + ((n0 + 64 + rows) // 32) * stride_sb + k0
    wa, wb_lo, wb_hi = gl.load(sa_rows), gl.load(sb_lo), gl.load(sb_hi)
    zero = gl.zeros([64, BLOCK_T], gl.float32, mma)
    acc_lo = gl.zeros([64, BLOCK_T], gl.float32, mma)
    acc_hi = gl.zeros([64, BLOCK_T], gl.float32, mma)
    for k in range(num_k):
        # the slot step k - 1 read is free (its MMAs were waited for): refill it a ring ahead
        if k + STAGES - 1 < num_k:
            _issue(w_desc, x_desc, w_ring, x_ring, ready, k + STAGES - 1, k0 + k + STAGES - 1, n0)
        # the next step's scale words (this step's at the last), a step ahead: loaded here, they are in registers
        # before the promotions need them
        ahead = gl.minimum(k + 1, num_k - 1)
        wa_next, wb_lo_next, wb_hi_next = gl.load(sa_rows + ahead), gl.load(sb_lo + ahead), gl.load(sb_hi + ahead)
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        w_tile = w_ring.index(slot)
        x_tile = x_ring.index(slot)
        for j in gl.static_range(4):
            b = x_tile.slice(32 * j, 32, dim=1).permute((1, 0))
            lo = warpgroup_mma(w_tile.slice(0, 64, dim=0).slice(32 * j, 32, dim=1), b, zero, use_acc=False,
                               is_async=True)
            hi = warpgroup_mma(w_tile.slice(64, 64, dim=0).slice(32 * j, 32, dim=1), b, zero, use_acc=False,
                               is_async=True)
            part_lo, part_hi = warpgroup_mma_wait(0, deps=(lo, hi))
            fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)[None, :]
            acc_lo = acc_lo + part_lo * (fa * _ue8m0_to_f32((wb_lo >> (8 * j)) & 0xFF)[:, None])
            acc_hi = acc_hi + part_hi * (fa * _ue8m0_to_f32((wb_hi >> (8 * j)) & 0xFF)[:, None])
        wa, wb_lo, wb_hi = wa_next, wb_lo_next, wb_hi_next
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    if SPLIT:
        d_ptr += split.to(gl.int64) * M * N
    _store_rows(acc_lo, d_ptr, n0 + rows, tokens, M, stride_d, SPLIT)
    _store_rows(acc_hi, d_ptr, n0 + 64 + rows, tokens, M, stride_d, SPLIT)


@triton.jit
def splitk_sum_kernel(part_ptr, d_ptr, M, N, splits, stride_d, BLOCK: tl.constexpr):
    """d[m, n] = bf16(((part[0, m, n] + part[1, m, n]) + part[2, m, n]) + ...), fp32 adds in ascending slice order.
    part fp32 [splits, M, N] contiguous; d bf16 [M, N], row stride stride_d. Grid cdiv(M * N, BLOCK)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < M * N
    acc = tl.load(part_ptr + offs, mask=keep, other=0.0)
    for s in range(1, splits):
        acc += tl.load(part_ptr + s * M * N + offs, mask=keep, other=0.0)
    tl.store(d_ptr + (offs // N) * stride_d + offs % N, acc.to(tl.bfloat16), mask=keep)
