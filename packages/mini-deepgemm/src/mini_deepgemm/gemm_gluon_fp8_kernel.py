"""Gluon kernel of the dense FP8 GEMM with the DeepSeek-V3 recipe: fp32 scales per 1 x 128 of A and 128 x 128 of B,
FP8 wgmma promoted into an fp32 accumulator every 128 of K.

Why: gemm_kernel.py's Triton version of the same math (64 x 128 tiles, plain pointer loads that Triton pipelines)
ran at 0.54x cuBLAS per-tensor FP8 on the issue's shapes (docs/reports/deepgemm-scaling.md). Hopper's recipe for
this GEMM is TMA copies into a ring of NVMMA-swizzled tiles (no address arithmetic or register staging for the
operands), wgmma straight from shared memory, and a 128 x 128 tile over two warpgroups. Gluon states all of that.

Schedule per program (BLOCK_M x BLOCK_N output tiles, BLOCK_M = 64 per math warpgroup (1 or 2), BLOCK_N 128 or
256, K in steps of 128; persistent: program p takes tiles p, p + grid, ..., so grid = the tile count is one tile per
program), in warp-specialized partitions:
- the producer, one warp with few registers: every step of the program's tiles, in order, by TMA into a
  STAGES-deep ring of (A [BLOCK_M, 128], B [BLOCK_N, 128]) FP8 tiles, each slot with a "ready" mbarrier that the
  copies complete (expect-tx) and an "empty" mbarrier that each math warpgroup arrives on when the MMAs that read
  it are done. The ring runs over the steps of all the program's tiles, so the next tile's first steps load while
  the current one finishes and stores;
- one partition per math warpgroup (the first is the default partition, with the registers the producer gives back:
  setmaxnreg). Warpgroup w owns rows [64 w, 64 w + 64) of each tile and all its columns, in 128-column halves: per
  step and half, wait for "ready", one async warpgroup MMA over the step's K = 128 into a fresh [64, 128] fp32 tile
  (use_acc false), wait for it, promote: acc += part * sa[m] * sb[half]; after the last half, arrive on "empty".
  Epilogue: bf16 through the warpgroup's own shared buffer and one TMA store per half (rows and columns past M, N
  are clipped by the copy), waited for only before the next tile's epilogue reuses the buffer. With one buffer a
  256-column tile's second half waits for the first half's store to leave it; STORE_BUFS = 2 gives the second half
  a buffer of its own (it fits beside 3 ring stages; gemm routes it where tiles have few K steps, session 63).
128-column tiles with an even number of K steps take them in pairs (_math_v3_pairs, session 64): both MMAs issued,
the first waited for alone and promoted while the second runs (1.04-1.15x the one-step loop; three fp32 tiles, so
256-column tiles cannot); gemm routes long-K GEMMs to them where their waves fill better than 128 x 256 tiles'.
Why one partition per warpgroup (session 14, docs/reports/deepgemm-gluon-v3.md): Gluon puts a barrier over the
whole partition around each single-thread operation (the slot's wait and release), so two warpgroups in one
partition ran in step and promoted at the same time while the tensor core idled. Apart, one promotes under the
other's MMAs: 1.08-1.13x at all 8 dense shapes, bitwise equal. Why 256 columns: the A tile is read once for twice
the MMAs (48 KB per step for 128 x 256 x 128, against 32 KB for half of it), a further 1.04-1.10x where the wider
tiles still fill the SMs' waves. A warpgroup then holds two [64, 128] accumulators and one fresh tile (192
registers of its 232); a fresh [64, 256] tile would need 64 more.
Why two partitions at all (session 11): in the single-partition kernel of session 10 the math warps also issued the
copies, with five CTA barriers per K step; the producer warp took them out of the math loop (1.01-1.04x). Keeping
two MMAs in flight (step k's running while step k - 1 is promoted, three fp32 tiles in registers) measured slower
in that kernel: 0.79-0.94x at 7 of 8 shapes.
The products are exact (e4m3 x e4m3 in the tensor core); the fp32 sums differ from the reference only in order
(and in the tensor core's own accumulation of one step's 128 products), as gemm_kernel's do.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)


@gluon.jit
def _tile_offsets(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(row, column) offsets of output tile `tile` in grouped order: GROUP_M row tiles share each sweep over the
    column tiles, so the B tiles they read are re-read from L2."""
    num_pid_m = gl.cdiv(M, BLOCK_M)
    tiles_per_sweep = GROUP_M * gl.cdiv(N, BLOCK_N)
    first_m = (tile // tiles_per_sweep) * GROUP_M
    sweep_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    return (first_m + (tile % tiles_per_sweep) % sweep_m) * BLOCK_M, (tile % tiles_per_sweep) // sweep_m * BLOCK_N


@gluon.jit
def _issue_step(a_desc, b_desc, a_ring, b_ring, ready, slot, off_m, off_n, k, sa_desc, sb_desc, sa_ring, sb_ring,
                SCALES: gl.constexpr):
    """TMA the K = k * BLOCK_K step of the tile at (off_m, off_n), A and B, into ring slot `slot`; with SCALES (the
    V4.1 kernel's SCALES_IN_RING) also the step's fp32 scales, A's [4, BLOCK_M] of the M-major [K / 32, M] scales
    and B's [4, 8] of [K / 32, ceil(N / 32)] (8 column blocks for the tile's 4: a TMA destination must be 128-byte
    aligned, so a ring slot of B's scales is 128 bytes; past the tensors TMA reads zeros; those outputs are clipped
    by the store). Without SCALES the scale arguments are unused stand-ins (warp_specialize takes no None)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    bar = ready.index(slot)
    if not SCALES:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    else:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes
                        + sb_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(sa_desc, [4 * k, off_m], bar, sa_ring.index(slot))
        tma.async_copy_global_to_shared(sb_desc, [4 * k, off_n // 32], bar, sb_ring.index(slot))
    tma.async_copy_global_to_shared(a_desc, [off_m, k * BLOCK_K], bar, a_ring.index(slot))
    tma.async_copy_global_to_shared(b_desc, [off_n, k * BLOCK_K], bar, b_ring.index(slot))


@gluon.jit
def _store_tile(acc, d_desc, d_smem, off_m, off_n, WAIT: gl.constexpr = True):
    """The tile as bf16 through shared memory and one TMA store. The previous tile's store must have read d_smem
    before it is overwritten (WAIT: wait for every store this thread issued; False where a wait since then already
    has); this one then drains under the next tile's MMAs."""
    if WAIT:
        tma.store_wait(pendings=0)
    d_smem.store(acc.to(d_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(d_desc, [off_m, off_n], d_smem)


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """A "ready" (one arrival: the producer's expect-tx) and an "empty" (CONSUMERS arrivals) mbarrier per ring
    slot."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    return ready, empty


@gluon.jit
def _allocate_ring(a_desc, b_desc, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The STAGES-deep ring of (A, B) tiles in the descriptors' swizzled layouts, with its barriers ("empty": one
    arrival per consumer partition)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, a_desc.block_type.shape[0], BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, b_desc.block_type.shape[0], BLOCK_K], b_desc.layout)
    ready, empty = _ring_barriers(STAGES, CONSUMERS)
    return a_ring, b_ring, ready, empty


@gluon.jit
def _invalidate_ring(ready, empty):
    STAGES: gl.constexpr = ready.type.shape[0]
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@gluon.jit
def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M: gl.constexpr, sa_desc, sb_desc, sa_ring,
              sb_ring, SCALES: gl.constexpr):
    """One warp: every step of this program's tiles, in order, into ring slot step % STAGES once that slot is empty
    (the first lap waits on the barriers' initial phase, which counts as complete). Its tile offsets are computed
    once per tile, not per step (session 10 run 6: integer divisions per step cost 0.75-0.8x). sa_desc, sb_desc,
    sa_ring, sb_ring, SCALES: the scales' copies of _issue_step."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    num_k = K // BLOCK_K
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(num_k):
            slot = step % STAGES
            mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
            _issue_step(a_desc, b_desc, a_ring, b_ring, ready, slot, off_m, off_n, k, sa_desc, sb_desc, sa_ring,
                        sb_ring, SCALES)
            step += 1


@gluon.jit
def _warpgroup_rows(tile, sa_ptr, M, N, stride_sa, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    GROUP_M: gl.constexpr, ROW0: gl.constexpr, rows_layout: gl.constexpr):
    """Tile `tile`'s column offset, the first of this warpgroup's 64 rows and pointers to their A scales (rows past
    M read row M - 1: their results are not stored)."""
    off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row0 = off_m + ROW0
    sa_rows = sa_ptr + gl.minimum(row0 + gl.arange(0, 64, layout=rows_layout), M - 1).to(gl.int64) * stride_sa
    return off_n, row0, sa_rows


@gluon.jit
def _math_v3(a_ring, b_ring, ready, empty, d_desc, d_lo, d_hi, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
             ROW0: gl.constexpr, GROUP_M: gl.constexpr, HI_BUF: gl.constexpr):
    """One math warpgroup's partition: rows [ROW0, ROW0 + 64) of each BLOCK_M x BLOCK_N tile, every column, in
    BLOCK_N / 128 halves (module docstring); d_lo and d_hi are its own [64, 128] store buffers of the halves, the
    same buffer unless HI_BUF. With a buffer of its own, a 256-column tile's second half is stored without waiting
    for the first half's store to leave shared memory."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    BLOCK_N: gl.constexpr = b_ring.type.shape[1]
    WIDE: gl.constexpr = BLOCK_N == 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // 128
    last_sb = gl.cdiv(N, 128) - 1
    # The fresh partial tile of every MMA (use_acc false) is the previous MMA's output registers: a new zero tile
    # per MMA kept a second 64-register tile live at 256 columns (376 bytes of spills, offline).
    part = gl.zeros([64, 128], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_n, row0, sa_rows = _warpgroup_rows(tile, sa_ptr, M, N, stride_sa, BLOCK_M, BLOCK_N, GROUP_M, ROW0,
                                               rows_layout)
        # a half past N reads the last scale block: its results are not stored
        sb_lo = sb_ptr + (off_n // 128) * stride_sb
        sb_hi = sb_ptr + gl.minimum(off_n // 128 + 1, last_sb) * stride_sb
        sa_next, sb_lo_next, sb_hi_next = gl.load(sa_rows), gl.load(sb_lo), gl.load(sb_hi)
        acc_lo = gl.zeros([64, 128], gl.float32, mma)
        acc_hi = gl.zeros([64, 128], gl.float32, mma)
        for k in range(num_k):
            scale_lo = sa_next * sb_lo_next
            scale_hi = sa_next * sb_hi_next
            # the next step's scales (this step's at the last), loaded a step ahead: a load consumed in its own
            # step stalled the warps (in order) between the step's MMAs until it returned from L2 (session 10)
            ahead = gl.minimum(k + 1, num_k - 1)
            sa_next, sb_lo_next, sb_hi_next = gl.load(sa_rows + ahead), gl.load(sb_lo + ahead), gl.load(sb_hi + ahead)
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            a = a_ring.index(slot).slice(ROW0, 64, dim=0)
            b = b_ring.index(slot)
            part = warpgroup_mma_wait(0, deps=(warpgroup_mma(a, b.slice(0, 128, dim=0).permute((1, 0)), part,
                                                             use_acc=False, is_async=True),))
            if WIDE:
                acc_lo += part * scale_lo[:, None]
                part = warpgroup_mma_wait(0, deps=(warpgroup_mma(a, b.slice(128, 128, dim=0).permute((1, 0)), part,
                                                                 use_acc=False, is_async=True),))
                mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup's MMAs on the slot are done
                acc_hi += part * scale_hi[:, None]
            else:
                mbarrier.arrive(empty.index(slot), count=1)
                acc_lo += part * scale_lo[:, None]
            step += 1
        _store_tile(acc_lo, d_desc, d_lo, row0, off_n)  # its wait also covers the previous tile's store from d_hi
        if WIDE:
            if off_n + 128 < N:
                _store_tile(acc_hi, d_desc, d_hi, row0, off_n + 128, WAIT=not HI_BUF)
    tma.store_wait(pendings=0)


@gluon.jit
def _issue_mma(a_ring, b_ring, ready, step, part, ROW0: gl.constexpr):
    """Wait for ring slot `step`'s operands and issue its [64, 128] x [128, 128] MMA into the fresh tile `part`
    (use_acc false), asynchronously: returns the MMA's token."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    slot = step % STAGES
    mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
    return warpgroup_mma(a_ring.index(slot).slice(ROW0, 64, dim=0), b_ring.index(slot).permute((1, 0)), part,
                         use_acc=False, is_async=True)


@gluon.jit
def _promote_step(acc, part, empty, step, scale):
    """Release step `step`'s ring slot (its MMA is done) and add its tile times the rows' scale."""
    STAGES: gl.constexpr = empty.type.shape[0]
    mbarrier.arrive(empty.index(step % STAGES), count=1)
    return acc + part * scale[:, None]


@gluon.jit
def _math_v3_pairs(a_ring, b_ring, ready, empty, d_desc, d_lo, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
                   ROW0: gl.constexpr, GROUP_M: gl.constexpr):
    """_math_v3 for 128-column tiles, K steps in pairs (num_k even): the pair's second MMA is issued into a second
    fresh tile before the first is waited for, so the first's promotion runs under the second's MMA. Three [64, 128]
    fp32 tiles (192 registers). No MMA stays in flight across the loop's back edge: chained across pairs (the next
    pair's first MMA issued before this pair's second promotion) ptxas serialized every wgmma (C7514) and spilled
    200 bytes, and chains of four spilled 464 (offline, triton 3.6, sm_90a). Scales are loaded a pair ahead. Every
    element: the same MMA and promotion."""
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    BLOCK_N: gl.constexpr = b_ring.type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // 128
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_n, row0, sa_rows = _warpgroup_rows(tile, sa_ptr, M, N, stride_sa, BLOCK_M, BLOCK_N, GROUP_M, ROW0,
                                               rows_layout)
        sb_col = sb_ptr + (off_n // 128) * stride_sb
        # the fresh tiles' stand-in accumulators start per tile: carried across tiles they stay live through the
        # epilogue beside acc
        p0 = gl.zeros([64, 128], gl.float32, mma)
        p1 = gl.zeros([64, 128], gl.float32, mma)
        acc = gl.zeros([64, 128], gl.float32, mma)
        sa0, sb0, sa1, sb1 = gl.load(sa_rows), gl.load(sb_col), gl.load(sa_rows + 1), gl.load(sb_col + 1)
        for k in range(0, num_k, 2):
            s0 = sa0 * sb0
            s1 = sa1 * sb1
            # the next pair's scales (this pair's at the last), loaded a pair ahead: loaded at the pair's start, the
            # FMUL waiting for them held 41% of the kernel's long-scoreboard samples (Nsight Compute, session 64)
            ahead = gl.minimum(k + 2, num_k - 2)
            sa0, sb0 = gl.load(sa_rows + ahead), gl.load(sb_col + ahead)
            sa1, sb1 = gl.load(sa_rows + ahead + 1), gl.load(sb_col + ahead + 1)
            t0 = _issue_mma(a_ring, b_ring, ready, step, p0, ROW0)
            t1 = _issue_mma(a_ring, b_ring, ready, step + 1, p1, ROW0)
            p0 = warpgroup_mma_wait(1, deps=(t0,))
            acc = _promote_step(acc, p0, empty, step, s0)
            p1 = warpgroup_mma_wait(0, deps=(t1,))
            acc = _promote_step(acc, p1, empty, step + 1, s1)
            step += 2
        _store_tile(acc, d_desc, d_lo, row0, off_n)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_v3_kernel(
    a_desc, b_desc, d_desc, sa_ptr, sb_ptr,
    M, N, K, stride_sa, stride_sb,
    STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    STORE_BUFS: gl.constexpr = 1, PAIRS: gl.constexpr = False,
):
    """d[m, n] = sum over 128-blocks kb of sa[m, kb] * sb[n // 128, kb] * (a[m, kb] . b[n, kb]), bf16 out.
    a_desc: e4m3 [M, K] in [BLOCK_M, 128] tiles (BLOCK_M 64 or 128: one or two math warpgroups); b_desc: e4m3
    [N, K] in [BLOCK_N, 128] tiles (BLOCK_N 128 or 256); d_desc: bf16 [M, N] in [64, 128] boxes; sa fp32
    [M, K / 128] (row stride stride_sa), sb fp32 [N / 128, K / 128] (row stride stride_sb); K % 128 == 0.
    Persistent: program p computes tiles p, p + grid, ... (grid = the tile count gives one tile per program).
    Launch with num_warps=4 (the first math warpgroup); the second (CONSUMER_REGS registers) and the producer warp
    (PRODUCER_REGS, in a warpgroup of its own: setmaxnreg works per warpgroup) come from warp_specialize, and the
    launch's maxnreg sets what the first warpgroup gets. Every output element is the same MMA and promotion
    whatever BLOCK_M and BLOCK_N, so the tile shape does not change a bit of the result. STORE_BUFS: store buffers
    per math warpgroup (2: 256-column tiles); PAIRS: 128 x 128 tiles take K steps in pairs (K / 128 even)."""
    CONSUMERS: gl.constexpr = a_desc.block_type.shape[0] // 64
    a_ring, b_ring, ready, empty = _allocate_ring(a_desc, b_desc, STAGES, CONSUMERS)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [CONSUMERS, 64, 128], d_desc.layout)
    HI_BUF: gl.constexpr = STORE_BUFS == 2
    d_smem_hi = gl.allocate_shared_memory(d_desc.dtype, [CONSUMERS, 64, 128], d_desc.layout) if HI_BUF else d_smem
    if PAIRS:
        gl.warp_specialize(
            [(_math_v3_pairs, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(0), sa_ptr, sb_ptr, M, N, K,
                               stride_sa, stride_sb, 0, GROUP_M)),
             (_math_v3_pairs, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(1), sa_ptr, sb_ptr, M, N, K,
                               stride_sa, stride_sb, 64, GROUP_M)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, a_desc, b_desc, a_ring,
                          b_ring, False))],
            [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [(_math_v3, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(0), d_smem_hi.index(0), sa_ptr, sb_ptr,
                         M, N, K, stride_sa, stride_sb, 0, GROUP_M, HI_BUF)),
             (_math_v3, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(1), d_smem_hi.index(1), sa_ptr, sb_ptr,
                         M, N, K, stride_sa, stride_sb, 64, GROUP_M, HI_BUF)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, a_desc, b_desc, a_ring,
                          b_ring, False))],
            [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize(
            [(_math_v3, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(0), d_smem_hi.index(0), sa_ptr, sb_ptr,
                         M, N, K, stride_sa, stride_sb, 0, GROUP_M, HI_BUF)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, a_desc, b_desc, a_ring,
                          b_ring, False))],
            [1], [PRODUCER_REGS])
    _invalidate_ring(ready, empty)


# ---- The V4.1 recipe: UE8M0 scales per 1 x 32 of A and 32 x 32 of B, promoted every 32 of K ----


@gluon.jit
def _ue8m0_to_f32(byte):
    """2^(byte - 127) as fp32, exactly: byte 0 is 2^-127, an fp32 subnormal (bit 22), not byte << 23 = 0. The Gluon
    counterpart of gemm_kernel.ue8m0_to_fp32 (a Gluon kernel cannot call a triton.jit function), which leaves byte 0
    out. max(byte << 23, bit 22) is that value for every byte 0-255 (byte >= 1 gives at least bit 23): one integer
    max where a compare and a select took two (offline, sm_90a: the split-K kernel's K step 721 -> 652 SASS
    instructions at 64 tokens, 227 -> 208 at 16)."""
    return gl.maximum(byte << 23, 0x00400000).to(gl.float32, bitcast=True)


@triton.jit
def ue8m0_to_f32_transposed_kernel(src_ptr, dst_ptr, R, C, stride_src, stride_dst, BLOCK_R: tl.constexpr,
                                   BLOCK_C: tl.constexpr):
    """dst[c, r] = 2^(src[r, c] - 127) as fp32, the bits _ue8m0_to_f32 builds (byte 0: the subnormal 2^-127):
    UE8M0 bytes [R, C] -> fp32 [C, R] (row stride stride_dst). Feeds fp8_gemm_v41_kernel's SCALES_IN_RING: A's
    scales M-major, B's per K block."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < R)[:, None] & (c < C)[None, :]
    e = tl.load(src_ptr + r.to(tl.int64)[:, None] * stride_src + c[None, :], mask=mask, other=127).to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, e << 23)
    tl.store(dst_ptr + c.to(tl.int64)[None, :] * stride_dst + r[:, None], bits.to(tl.float32, bitcast=True), mask=mask)


@gluon.jit
def _promote(acc, part, fa, fb0, fb1, fb2, fb3):
    """acc + part * (sa[m] * sb[block]) for a partial tile [64, 32 c] of c = 1 or 4 column blocks: fa the rows' A
    scales, fb0..fb3 the blocks' B scales (c = 1: fb0). A column's block is a constant of the register that holds it
    in the MMA layout (columns 32 b .. 32 b + 31 are n8 groups 4 b .. 4 b + 3 of every thread), so the selects fold
    away and a thread multiplies its 2 rows x c blocks scale products once. The same fp32 operations for every
    element whatever the tile shape and where the scales come from (see fp8_gemm_v41_kernel)."""
    blk = (gl.arange(0, acc.type.shape[1], gl.SliceLayout(0, acc.type.layout)) // 32)[None, :]
    high = gl.where(blk == 2, (fa * fb2)[:, None], (fa * fb3)[:, None])
    return acc + part * gl.where(blk == 0, (fa * fb0)[:, None], gl.where(blk == 1, (fa * fb1)[:, None], high))


@gluon.jit
def _word_scale(word, j: gl.constexpr):
    """K block j's scale(s) of a step from its UE8M0 word(s), as fp32."""
    return _ue8m0_to_f32((word >> (8 * j)) & 0xFF)


@gluon.jit
def _ring_scale(ring, slot, j: gl.constexpr, first: gl.constexpr, count: gl.constexpr, layout: gl.constexpr):
    """K block j's fp32 scales [first, first + count) from ring slot `slot` ([4, n] per slot: K block, row or column
    block; unswizzled, so row-major), in `layout`. Read through a view as STAGES * 4 rows of n: Gluon (triton 3.6)
    indexes a buffer down to one dimension only when its shared layout has one dimension less than the buffer, which
    the TMA layout (rank 2 for the [4, n] boxes) does not."""
    STAGES: gl.constexpr = ring.type.shape[0]
    n: gl.constexpr = ring.type.shape[2]
    rows = ring._reinterpret(gl.float32, [STAGES * 4, n], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    return rows.index(slot * 4 + j).slice(first, count).load(layout)


@gluon.jit
def _math_v41(a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem, sa_ptr, sb_ptr, M, N,
              K, stride_sa, stride_sb, slice_steps, GROUP_M: gl.constexpr, ROW0: gl.constexpr,
              SCALES_IN_RING: gl.constexpr):
    """One math warpgroup's partition for the V4.1 recipe: rows [ROW0, ROW0 + 64) of each BLOCK_M x BLOCK_N tile. Per
    ring step (K = 128) and per 32 of K: the A fragment loaded into registers (ldmatrix), one m64nBLOCK_Nk32 MMA into
    a fresh fp32 tile, wait, one FMA per accumulator element (_promote). ptxas places a K block's FMAs under the next
    K block's MMA (different registers). The tile is stored from d_smem, the warpgroup's own buffer, as one TMA box.
    One MMA per K block, not one per 32-column block (sessions 12-17): Triton builds each MMA's shared-memory
    descriptors afresh, and in this issue-bound loop 16 MMAs per step cost ~80 uniform instructions (128 x 128
    tiles: 565 -> 481 instructions per warp and step with the scale words, 450 -> 369 with the ring; session 18).
    Scales: with SCALES_IN_RING the step's fp32 scales are in the ring slot with its operands (sa_ring [4, BLOCK_M],
    sb_ring [4, 8], of which the tile's 4 column blocks are read: the producer's TMA), read with a shared-memory load
    each; else the UE8M0 words are loaded from global memory a step ahead (sa_ptr, sb_ptr) and converted here.
    K slices: the promotions of each slice_steps steps start from zero and the slices' sums are added in order, the
    sums the split-K kernel's programs and splitk_sum_kernel form (gemm_gluon_fp8_splitk_kernel)."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    ROWS: gl.constexpr = 64
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert((BLOCK_N == 32 or BLOCK_N == 128) and BLOCK_K == 128, "1 or 4 column blocks, 4 K blocks a step")
    WIDE: gl.constexpr = BLOCK_N == 128
    gl.static_assert(WIDE or not SCALES_IN_RING, "scales in the ring: BLOCK_N 128 (4 column blocks)")
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // BLOCK_K
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    last_nb = (N - 1) // 32
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if not SCALES_IN_RING:
            offs_m = off_m + ROW0 + gl.arange(0, ROWS, layout=rows_layout)
            sa_rows = sa_ptr + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_sa
            nb = off_n // 32  # column blocks past the last (N not a multiple of BLOCK_N) read the last: the store clips
            sb0 = sb_ptr + nb * stride_sb
            sb1 = sb_ptr + gl.minimum(nb + 1, last_nb) * stride_sb
            sb2 = sb_ptr + gl.minimum(nb + 2, last_nb) * stride_sb
            sb3 = sb_ptr + gl.minimum(nb + 3, last_nb) * stride_sb
            wa, wb0 = gl.load(sa_rows), gl.load(sb0)
            wb1, wb2, wb3 = wb0, wb0, wb0
            if WIDE:
                wb1, wb2, wb3 = gl.load(sb1), gl.load(sb2), gl.load(sb3)
        total = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
        for k_first in range(0, num_k, slice_steps):
            acc = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
            for k in range(k_first, gl.minimum(k_first + slice_steps, num_k)):
                slot = step % STAGES
                if not SCALES_IN_RING:
                    # the next step's scale words (of this step at the last), loaded a step ahead as in _math_v3
                    ahead = gl.minimum(k + 1, num_k - 1)
                    na, nb0 = gl.load(sa_rows + ahead), gl.load(sb0 + ahead)
                    nb1, nb2, nb3 = nb0, nb0, nb0
                    if WIDE:
                        nb1, nb2, nb3 = gl.load(sb1 + ahead), gl.load(sb2 + ahead), gl.load(sb3 + ahead)
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                a_tile = a_ring.index(slot)
                if ROWS < BLOCK_M:
                    a_tile = a_tile.slice(ROW0, ROWS, dim=0)
                b_tile = b_ring.index(slot)
                for j in gl.static_range(4):
                    a_frag = a_tile.slice(32 * j, 32, dim=1).load(a_op)
                    part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                        a_frag, b_tile.slice(32 * j, 32, dim=1).permute((1, 0)), zero, use_acc=False, is_async=True),))
                    if SCALES_IN_RING:
                        acc = _promote(acc, part, _ring_scale(sa_ring, slot, j, ROW0, ROWS, rows_layout),
                                       _ring_scale(sb_ring, slot, j, 0, 1, rows_layout),
                                       _ring_scale(sb_ring, slot, j, 1, 1, rows_layout),
                                       _ring_scale(sb_ring, slot, j, 2, 1, rows_layout),
                                       _ring_scale(sb_ring, slot, j, 3, 1, rows_layout))
                    else:
                        acc = _promote(acc, part, _word_scale(wa, j), _word_scale(wb0, j), _word_scale(wb1, j),
                                       _word_scale(wb2, j), _word_scale(wb3, j))
                # every MMA that read the slot is done (each warpgroup waited for its own; see _math_v3)
                if SCALES_IN_RING:
                    # ptxas issues the last scale loads (LDS) from the slot just before the arrive and reads them after
                    # it: a proxy fence waits for them, or the producer's TMA refill may land first (session 38:
                    # benchmarks/check_smem_release.py; docs/reports/deepgemm-moe-fold-128.md)
                    fence_async_shared()
                mbarrier.arrive(empty.index(slot), count=1)
                if not SCALES_IN_RING:
                    wa, wb0, wb1, wb2, wb3 = na, nb0, nb1, nb2, nb3
                step += 1
            total = total + acc
        tma.store_wait(pendings=0)  # the previous tile's store has read d_smem
        d_smem.store(total.to(d_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(d_desc, [off_m + ROW0, off_n], d_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_v41_kernel(
    a_desc, b_desc, d_desc, sa_ptr, sb_ptr, sa_desc, sb_desc,
    M, N, K, stride_sa, stride_sb, slice_steps,
    STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    SCALES_IN_RING: gl.constexpr,
):
    """d[m, n] = sum over 32-blocks kb of sa[m, kb] * sb[n // 32, kb] * (a[m, kb] . b[n, kb]), bf16 out.
    a_desc: e4m3 [M, K] in [BLOCK_M, 128] tiles (BLOCK_M 64 or 128: one or two math warpgroups); b_desc: e4m3
    [N, K] in [BLOCK_N, 128] tiles (BLOCK_N 32 or 128); d_desc: bf16 [M, N] in [64, BLOCK_N] boxes; K % 128 == 0.
    Scales, one of two forms:
    - SCALES_IN_RING (BLOCK_N 128): sa_desc, sb_desc: TMA descriptors of the scales as fp32 (the values
      _ue8m0_to_f32 gives), A's M-major [K / 32, M] in [4, BLOCK_M] boxes, B's [K / 32, ceil(N / 32)] in [4, 8]
      boxes (128 bytes: TMA's shared-memory alignment); sa_ptr, sb_ptr unused. The producer brings them into the
      ring with each step's operands, and the math warps neither load nor convert scales (session 17: those were
      ~115 of the ~565 instructions per warp and K step of this issue-bound loop; the kernel 1.10x;
      docs/reports/profile-ncu-s17.md, deepgemm-gluon-v41.md);
    - else: sa_ptr: int32 view of the UE8M0 bytes [M, K / 32] (four scales per word; row stride stride_sa words),
      sb_ptr: the same of [ceil(N / 32), K / 32]; sa_desc, sb_desc unused (None).
    Persistent and warp-specialized like fp8_gemm_v3_kernel, with its producer and one partition per math warpgroup
    (session 14: 1.01-1.06x the two warpgroups in one partition, bitwise equal); launch with num_warps=4. Every
    output element is computed the same way whatever BLOCK_M, BLOCK_N, the program count and the scales' form (per 32
    of K an MMA over its 32 products, m64n32k32 or m64n128k32, then one FMA with sa * sb, the same fp32 values; that
    the two MMA widths give an element the same bits is checked on the H200 by test_gemm_gluon_v41.py), so a row's
    result does not depend on the launch that carries it."""
    CONSUMERS: gl.constexpr = a_desc.block_type.shape[0] // 64
    a_ring, b_ring, ready, empty = _allocate_ring(a_desc, b_desc, STAGES, CONSUMERS)
    # warp_specialize takes no None: without SCALES_IN_RING the operands' descriptors and rings stand in (unused)
    sa_ring = a_ring
    sb_ring = b_ring
    scale_descs = (a_desc, b_desc)
    if SCALES_IN_RING:
        scale_descs = (sa_desc, sb_desc)
        sa_ring = gl.allocate_shared_memory(sa_desc.dtype, [STAGES, 4, sa_desc.block_type.shape[1]], sa_desc.layout)
        sb_ring = gl.allocate_shared_memory(sb_desc.dtype, [STAGES, 4, 8], sb_desc.layout)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [64, b_desc.block_type.shape[0]], d_desc.layout)
    if CONSUMERS == 2:
        d_smem_1 = gl.allocate_shared_memory(d_desc.dtype, [64, b_desc.block_type.shape[0]], d_desc.layout)
        gl.warp_specialize(
            [(_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, slice_steps, GROUP_M, 0, SCALES_IN_RING)),
             (_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem_1, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, slice_steps, GROUP_M, 64, SCALES_IN_RING)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, scale_descs[0],
                          scale_descs[1], sa_ring, sb_ring, SCALES_IN_RING))],
            [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize(
            [(_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, slice_steps, GROUP_M, 0, SCALES_IN_RING)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, scale_descs[0],
                          scale_descs[1], sa_ring, sb_ring, SCALES_IN_RING))],
            [1], [PRODUCER_REGS])
    _invalidate_ring(ready, empty)
