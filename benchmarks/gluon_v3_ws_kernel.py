"""Experiment kernel (issue 4, not in the package, never run on a GPU yet): the V3-recipe FP8 GEMM of
mini_deepgemm/gemm_gluon_fp8_kernel.py with a warp-specialized TMA producer.

Why: the SASS of the shipped kernel has five CTA barriers per K step, because Gluon wraps every single-thread
operation (the mbarrier wait, the expect-tx, each TMA copy) in one, so the two warpgroups run in lock step and the
tensor core idles while both promote (docs/reports/deepgemm-gluon-v3.md). Here one producer warp (its own partition,
few registers) issues every TMA copy of the program's steps, gated per ring slot by an "empty" mbarrier that the
math partition arrives on once the MMA that read the slot is done; the math partition (8 warps, both warpgroups)
only waits for "ready", runs the MMA, releases the slot and promotes. Same tiles, order of tiles and products, and
the same promotion arithmetic, so the output must be bitwise equal to the shipped kernel's
(`exp_gemm_gluon_v3_ws.py` checks that before it times anything).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma_wait

from mini_deepgemm.gemm_gluon_fp8_kernel import (
    _mma_of_step, _scales_ahead, _store_tile, _tile_offsets, _tile_start, acc_layout,
)


@gluon.jit
def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M: gl.constexpr):
    """One warp: every step of this program's tiles, in order, into ring slot step % STAGES once that slot is empty
    (the first lap waits on the barriers' initial phase, which counts as complete)."""
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
            bar = ready.index(slot)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, k * BLOCK_K], bar, a_ring.index(slot))
            tma.async_copy_global_to_shared(b_desc, [off_n, k * BLOCK_K], bar, b_ring.index(slot))
            step += 1


@gluon.jit
def _math(a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem, sa_ptr, sb_ptr, M, N, K, stride_sa,
          stride_sb, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    """The default partition (both warpgroups): MMA, release the slot, promote; the epilogue of each tile."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    mma: gl.constexpr = acc_layout(num_warps, BLOCK_N)
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // BLOCK_K
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n, sa_rows, sb_row, sa_next, sb_next = _tile_start(
            tile, sa_ptr, sb_ptr, M, N, stride_sa, stride_sb, BLOCK_M, BLOCK_N, GROUP_M, rows_layout)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
        for k in range(num_k):
            scale = sa_next * sb_next
            sa_next, sb_next = _scales_ahead(sa_rows, sb_row, k, num_k)
            part = warpgroup_mma_wait(0, deps=(_mma_of_step(a_ring, b_ring, ready, zero, step),))
            mbarrier.arrive(empty.index(step % STAGES), count=1)  # both warpgroups are past their waits: slot free
            acc += part * scale[:, None]
            step += 1
        _store_tile(acc, d_desc, d_smem, off_m, off_n)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_v3_ws_kernel(
    a_desc, b_desc, d_desc, sa_ptr, sb_ptr,
    M, N, K, stride_sa, stride_sb,
    STAGES: gl.constexpr, GROUP_M: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
):
    """fp8_gemm_v3_kernel's contract (persistent; grid = programs), with a producer partition of one warp."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [BLOCK_M, BLOCK_N], d_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize(
        [(_math, (a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem, sa_ptr, sb_ptr, M, N, K, stride_sa,
                  stride_sb, GROUP_M, num_warps)),
         (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M))],
        [1], [PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
