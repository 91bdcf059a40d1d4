"""Gluon kernel of the grouped FP8 x FP4 GEMMs (MoE prefill: contiguous, decode: masked), weights converted in the
MMA's register layout.

Why: the Triton swap-AB kernel (gemm_swapab_kernel.py) converts each FP4 weight tile in a blocked layout and passes
the bf16 result through shared memory once more before the MMA's register load: per 4 KB of packed weights a K
step moves ~40 KB through shared memory (cp.async write and read, the bf16 tile's write and read). Triton's
compiler decides where that conversion goes (the pipeliner loads bytes in a blocked layout and the layout pass
then sinks the conversion below the bf16 arithmetic; docs/reports/deepgemm-gluon.md). Gluon states the layouts:
the packed bytes are read from shared memory straight into the wgmma A-operand layout, converted there (the same
inline-PTX e2m1 -> bf16 conversion, the scale multiply folded into it), and fed to wgmma from registers, so a K step
moves the 4 KB of bytes through shared memory once.

The math is gemm_swapab_kernel's for W_IS_FP4: D^T[n, m] = W[n, :] . X[m, :] with X the bf16 activations from
dequant_act_kernel in the FP4 K order ([32 even | 32 odd] per 64-block), the even (low nibble) and odd (high
nibble) weight values fed to two MMAs of K = 32; so every product and its K order are the same as the Triton kernel's.

Schedule per CTA (one warpgroup, BLOCK_N weight rows x BLOCK_M tokens; two CTAs per SM at 128 x 128, 3 stages):
- a STAGES-deep cp.async ring of (packed weights [BLOCK_N, 32] B, scale words [BLOCK_N] int32, X [2, BLOCK_M, 32]);
- per K step: wait for its copies, load the bytes and scale words into the A-operand layout, convert (scale folded
  into the asm, so the values leave it as the packed bf16x2 operand registers), two async MMAs, wait for them,
  refill the ring slot.
Measured on H200 (docs/reports/deepgemm-gluon.md), bitwise equal to the Triton kernel: 1.03-1.15x at 128-1,024
rows per expert (contiguous, 128 x 128), 1.05-1.30x for the masked decode GEMM (16 or 32 tokens x 128). Masked
tiles copy activation rows up to the buffer's max_m, not only the group's (cheap: 16-32 rows per step). Letting
step i's conversion run under step i-1's MMAs was slower (342 against 401 TFLOP/s): ptxas then serializes the
wgmmas (warning C7515), even with the in-flight operands kept alive.

The contiguous layout (MoE prefill) runs fp4_contiguous_ws_kernel since session 13: the same step warp-specialized
(docs/reports/deepgemm-gluon-fp4-ws.md). One persistent CTA per SM, 256 weight rows x 128 tokens per tile:
- a producer warp issues every copy by TMA (the two [128, 32] bf16 halves of a K step's activations, the [256, 32]
  packed weight bytes) into a STAGES-deep ring with "ready" (expect-tx) and "empty" mbarriers;
- two consumer warpgroups, each a partition of its own, share the activation tile (half the activation bytes per
  FLOP of fp4_grouped_gemm_kernel's 128 x 128 CTAs) and take 128 weight rows each, converting and multiplying them
  as above; each releases a ring slot on its own, so the two drift apart and one converts while the other's MMAs
  run (what two co-resident CTAs of fp4_grouped_gemm_kernel did by chance).
Session 13 run 2 (H200, 96 / 192 experts of 128-1,024 rows, w13 and w2): 480-488 against 402-419 TFLOP/s
(1.15-1.20x), bitwise equal; at ~64 rows per expert (half of each 128-token tile padding) 1.25-1.31x the swap-AB
kernel (run 5). On the masked layout's 16- and 32-token tiles the same structure ran 0.25-0.40x of
fp4_grouped_gemm_kernel (not profiled; many small co-resident CTAs keep more weight copies in flight than one
persistent CTA per SM), so masked stays on it; its contiguous layout remains the baseline the tests and
experiments compare with.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

from .gemm_gluon_fp8_kernel import _invalidate_ring, _ring_barriers, _tile_offsets

# gemm_swapab_kernel's nibble conversion (_FP4_NIBBLE_PTX) in the GEMMs' byte-pair form (session 16): Triton loads a
# row's packed bytes into the A-operand layout as 16-bit pairs ($2); the earlier 4-byte form took 2 + 2 bytes of two
# rows, which ptxas reassembled with ~40 PRMT per K step. Here one asm takes one pair: prmt spreads its two bytes to
# the register's 16-bit halves, giving both nibbles' bf16x2 (even values $0, odd $1), with the scale multiply folded
# in: $3 is the pair's scale as a duplicated bf16x2 (a pair shares a row and a 32-value half; $4, the second
# element's copy, is unused). 364 -> 316 SASS instructions per warp and K step of the masked kernel; session 16 run
# 1: 1.06-1.11x (masked decode), 1.02-1.04x (warp-specialized prefill), bitwise equal (docs/reports/deepgemm-gluon.md).
_PAIR_PTX: gl.constexpr = gl.constexpr("""
{
.reg .b32 w, b01, u, two126;
mov.b32 two126, 0x7E807E80;
cvt.u32.u16 w, $2;
prmt.b32 b01, w, w, 0x3130;
and.b32 u, b01, 0x000F000F; mul.lo.u32 u, u, 0x1040; and.b32 u, u, 0x81C081C0; mul.rn.bf16x2 u, u, two126; mul.rn.bf16x2 $0, u, $3;
and.b32 u, b01, 0x00F000F0; mul.lo.u32 u, u, 0x104; and.b32 u, u, 0x81C081C0; mul.rn.bf16x2 u, u, two126; mul.rn.bf16x2 $1, u, $3;
}
""")
# The same with the 2^126 multiply folded into the scale: $3 holds 2^(e - 1), the scale times 2^126, so one multiply
# per 2 values remains (HMUL2 64 -> 32 per step). Exact while 2^(e - 1) is a finite bf16: UE8M0 bytes e <= 128
# (scales <= 2; an FP4 checkpoint's are amax / 6), which the caller states (gemm.py: weight_scale_max).
# Session 16 run 1: 1.02-1.06x the pair form on the masked GEMM, 1.03-1.04x on the prefill one.
_PAIR_FOLDED_PTX: gl.constexpr = gl.constexpr(_PAIR_PTX.value.replace("mul.rn.bf16x2 u, u, two126; ", ""))


@gluon.jit
def weights_of_step(packed, word, step, second, FOLD: gl.constexpr):
    """The bf16 weights of K step `step` (64 values) in the wgmma A-operand layout: (even, odd) values of the packed
    bytes (packed's layout), each times its UE8M0 scale, exactly. word: the int32 scale word of each row (step's two
    scales at bits (step % 2) * 16); second: the byte columns that take the step's second scale (16..31). FOLD: the
    folded conversion (_PAIR_FOLDED_PTX; every scale byte <= 128), bitwise equal to the unfolded one there. Byte 0
    gives scale 0 in both (not 2^-127), as in every FP4 kernel of the package, so that all routes give the same bits."""
    shift = (step % 2) * 16
    if FOLD:  # 2^(e-1) as bf16 bits
        b0 = (word >> shift) & 0xFF
        e0 = gl.where(b0 == 0, 0, (b0 + 126) << 7)
        b1 = (word >> (shift + 8)) & 0xFF
        e1 = gl.where(b1 == 0, 0, (b1 + 126) << 7)
    else:
        e0 = ((word >> shift) & 0xFF) << 7  # 2^(e-127) as bf16 bits
        e1 = ((word >> (shift + 8)) & 0xFF) << 7
    pair_scale = gl.where(second, (e1 | (e1 << 16))[:, None], (e0 | (e0 << 16))[:, None])
    if FOLD:
        w_even, w_odd = gl.inline_asm_elementwise(_PAIR_FOLDED_PTX, "=r,=r,h,r,r", [packed, pair_scale],
                                                  dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)
    else:
        w_even, w_odd = gl.inline_asm_elementwise(_PAIR_PTX, "=r,=r,h,r,r", [packed, pair_scale],
                                                  dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)
    return w_even, w_odd


@gluon.jit
def _issue_step(w_ring, sw_ring, x_ring, slot, step, w_ptrs, sw_ptrs, x_ptrs, x_mask):
    """cp.async one K step (64 values) into ring slot `slot`: 32 packed bytes per weight row, the scale word of the
    row that holds this step's two UE8M0 bytes, and the two [BLOCK_M, 32] halves of the activations."""
    async_copy.async_copy_global_to_shared(w_ring.index(slot), w_ptrs + 32 * step)
    async_copy.async_copy_global_to_shared(sw_ring.index(slot), sw_ptrs + step // 2)
    async_copy.async_copy_global_to_shared(x_ring.index(2 * slot), x_ptrs + 64 * step, mask=x_mask)
    async_copy.async_copy_global_to_shared(x_ring.index(2 * slot + 1), x_ptrs + 64 * step + 32, mask=x_mask)
    async_copy.commit_group()


@gluon.jit
def fp4_grouped_gemm_kernel(
    x_ptr, w_ptr, sw_ptr, d_ptr, group_ptr,
    M, N, K,
    stride_x_g, stride_x, stride_w_g, stride_w_n, stride_sw_g, stride_sw_n, stride_d_g, stride_d,
    MASKED: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
    FOLD_SCALE: gl.constexpr,
):
    """d[m, n] = sum_k x[m, k] * dequant(w[group])[n, k]: x bf16 in the FP4 K order, w packed e2m1 [G, N, K / 2]
    (low nibble = even k), sw UE8M0 [G, N, K / 32] read as int32 words (K % 128 == 0).
    Contiguous (MASKED false): x [M, K], d [M, N], group_ptr the int32 layout [M] (-1 = padding; segments aligned to
    BLOCK_M); rows whose id is -1 are not written. Masked: x [G, M, K], d [G, M, N], group_ptr masked_m int32 [G],
    grid axis 1 the group; rows past masked_m[g] are neither read as results nor written. FOLD_SCALE: every byte of
    sw is <= 128, so the conversion may fold its 2^126 into the scale (weights_of_step; bitwise equal results)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_a: gl.constexpr = gl.SliceLayout(1, a_layout)
    cols_a: gl.constexpr = gl.SliceLayout(0, a_layout)
    w_copy: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])  # 16 B per cp.async
    if BLOCK_M >= 32:
        x_copy: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    else:  # 16 rows: 4 bf16 per copy, so no thread copies a row twice
        x_copy: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    sw_copy: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    w_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    sw_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    off_m, off_n = _tile_offsets(gl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)  # grouped tile order

    if MASKED:
        group = gl.program_id(1)
        rows_in_group = gl.load(group_ptr + group)
        if off_m >= rows_in_group:
            return
        x_ptr += group.to(gl.int64) * stride_x_g
        d_ptr += group.to(gl.int64) * stride_d_g
    else:  # expert of the row tile (segments are BLOCK_M-aligned: the first row is padding only if all are)
        group = gl.load(group_ptr + off_m)
        if group < 0:
            return
    w_base = w_ptr + group.to(gl.int64) * stride_w_g
    sw_base = (sw_ptr + group.to(gl.int64) * stride_sw_g).to(gl.pointer_type(gl.int32))

    n_w = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, w_copy))
    w_ptrs = w_base + (n_w % N).to(gl.int64)[:, None] * stride_w_n + gl.arange(0, 32, gl.SliceLayout(0, w_copy))[None, :]
    n_s = off_n + gl.arange(0, BLOCK_N, sw_copy)
    sw_ptrs = sw_base + (n_s % N).to(gl.int64) * (stride_sw_n // 4)
    m_x = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, x_copy))
    x_ptrs = x_ptr + (m_x % M).to(gl.int64)[:, None] * stride_x + gl.arange(0, 32, gl.SliceLayout(0, x_copy))[None, :]
    x_mask = (m_x < M)[:, None]

    w_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, 32], w_shared)
    sw_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], sw_shared)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BLOCK_M, 32], x_shared)

    steps = K // 64
    for s in gl.static_range(STAGES - 1):  # one copy group per step, empty past the last: wait_group counts groups
        if s < steps:
            _issue_step(w_ring, sw_ring, x_ring, s, s, w_ptrs, sw_ptrs, x_ptrs, x_mask)
        else:
            async_copy.commit_group()

    second = (gl.arange(0, 32, cols_a) >= 16)[None, :]  # bytes 16..31 hold values 32..63: the block's 2nd scale
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    for i in range(steps):
        slot = i % STAGES
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()  # every thread's copies of step i have landed
        packed = w_ring.index(slot).load(a_layout)
        word = sw_ring.index(slot).load(rows_a)
        w_even, w_odd = weights_of_step(packed, word, i, second, FOLD_SCALE)
        fence_async_shared()
        tok = warpgroup_mma(w_even, x_ring.index(2 * slot).permute((1, 0)), acc, is_async=True)
        tok = warpgroup_mma(w_odd, x_ring.index(2 * slot + 1).permute((1, 0)), tok, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[tok])  # the MMAs are done: the ring slot can be refilled
        nxt = i + STAGES - 1
        if nxt < steps:
            _issue_step(w_ring, sw_ring, x_ring, nxt % STAGES, nxt, w_ptrs, sw_ptrs, x_ptrs, x_mask)
        else:
            async_copy.commit_group()

    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, 4], [0, 1])  # n fastest: d rows are n-contiguous
    out = gl.convert_layout(acc.to(gl.bfloat16), out_layout)
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, out_layout))
    offs_m = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, out_layout))
    if MASKED:
        row_ok = offs_m < rows_in_group
    else:
        row_ok = gl.load(group_ptr + offs_m, mask=offs_m < M, other=-1) == group
    mask = row_ok[None, :] & (offs_n < N)[:, None]
    gl.store(d_ptr + offs_m.to(gl.int64)[None, :] * stride_d + offs_n[:, None], out, mask=mask)


@gluon.jit
def _ws_tile(tile, layout_ptr, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(off_m, off_n, group) of persistent tile `tile` (grouped order over [M, N]), the same in every partition;
    group is the layout's id of the tile's first row (segments are BLOCK_M-aligned; -1: padding only)."""
    off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return off_m, off_n, gl.load(layout_ptr + off_m)


@gluon.jit
def _scale_word_rows(sw_ptr, group, rows, N, stride_sw_g, stride_sw_n):
    """int32 pointers to the scale words of weight rows `rows` of expert `group` (sw UE8M0 [G, N, K / 32], strides in
    bytes; word i holds K steps 2i and 2i + 1); rows past N read row N - 1 (their results are not stored)."""
    return (sw_ptr + group.to(gl.int64) * stride_sw_g).to(gl.pointer_type(gl.int32)) \
        + gl.minimum(rows, N - 1).to(gl.int64) * (stride_sw_n // 4)


@gluon.jit
def _ws_producer(x_desc, w_desc, x_ring, w_ring, ready, empty, layout_ptr, M, N, K, GROUP_M: gl.constexpr):
    """One warp: every K step (64 values) of this program's tiles that hold rows, in order, into ring slot
    step % STAGES once both consumer warpgroups have released it."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_N: gl.constexpr = w_ring.type.shape[1]
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    steps = K // 64
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n, group = _ws_tile(tile, layout_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if group >= 0:
            for i in range(steps):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)  # passes at once on the first lap
                bar = ready.index(slot)
                mbarrier.expect(bar, 2 * x_desc.block_type.nbytes + w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(x_desc, [off_m, 64 * i], bar, x_ring.index(2 * slot))
                tma.async_copy_global_to_shared(x_desc, [off_m, 64 * i + 32], bar, x_ring.index(2 * slot + 1))
                tma.async_copy_global_to_shared(w_desc, [group * N + off_n, 32 * i], bar, w_ring.index(slot))
                step += 1


@gluon.jit
def _ws_consumer(x_ring, w_ring, ready, empty, sw_ptr, d_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n, stride_d,
                 HALF: gl.constexpr, GROUP_M: gl.constexpr, FOLD_SCALE: gl.constexpr):
    """One warpgroup: weight rows [HALF * 128, HALF * 128 + 128) of each tile, fp4_grouped_gemm_kernel's step on
    them, its scale word loaded from global memory a step ahead."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_N: gl.constexpr = w_ring.type.shape[1]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    ROWS: gl.constexpr = BLOCK_N // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, 4], [0, 1])  # n fastest: d rows n-contiguous
    second = (gl.arange(0, 32, gl.SliceLayout(0, a_layout)) >= 16)[None, :]  # bytes 16..31: the 2nd scale
    steps = K // 64
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n, group = _ws_tile(tile, layout_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if group >= 0:
            n0 = off_n + HALF * ROWS
            rows = n0 + gl.arange(0, ROWS, gl.SliceLayout(1, a_layout))
            sw_rows = _scale_word_rows(sw_ptr, group, rows, N, stride_sw_g, stride_sw_n)
            word = gl.load(sw_rows)
            acc = gl.zeros([ROWS, BLOCK_M], gl.float32, mma)
            for i in range(steps):
                slot = step % STAGES
                ahead = gl.load(sw_rows + gl.minimum(i + 1, steps - 1) // 2)  # one word holds two steps' scales
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                packed = w_ring.index(slot).slice(HALF * ROWS, ROWS, dim=0).load(a_layout)
                w_even, w_odd = weights_of_step(packed, word, i, second, FOLD_SCALE)
                tok = warpgroup_mma(w_even, x_ring.index(2 * slot).permute((1, 0)), acc, is_async=True)
                tok = warpgroup_mma(w_odd, x_ring.index(2 * slot + 1).permute((1, 0)), tok, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[tok])
                mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup is done with the slot
                word = ahead
                step += 1
            out = gl.convert_layout(acc.to(gl.bfloat16), out_layout)
            offs_n = n0 + gl.arange(0, ROWS, gl.SliceLayout(1, out_layout))
            offs_m = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, out_layout))
            row_ok = gl.load(layout_ptr + offs_m, mask=offs_m < M, other=-1) == group
            mask = row_ok[None, :] & (offs_n < N)[:, None]
            gl.store(d_ptr + offs_m.to(gl.int64)[None, :] * stride_d + offs_n[:, None], out, mask=mask)


@gluon.jit
def fp4_contiguous_ws_kernel(x_desc, w_desc, sw_ptr, d_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n, stride_d,
                             STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             PRODUCER_REGS: gl.constexpr, FOLD_SCALE: gl.constexpr):
    """The contiguous layout of fp4_grouped_gemm_kernel, warp-specialized: d[m, n] = sum_k x[m, k] *
    dequant(w[layout[m]])[n, k]. x bf16 [M, K] in the FP4 K order, by x_desc in [BLOCK_M, 32] boxes; w packed e2m1
    as uint8 [G * N, K / 2] by w_desc in [BLOCK_N = 256, 32] boxes (rows of the next group, or TMA's zeros past the
    last, fill a partial tile; their results are not stored); sw UE8M0 [G, N, K / 32] read as int32 words (strides
    in bytes, K % 128 == 0); layout_ptr int32 [M] (-1 = padding, segments BLOCK_M-aligned): rows whose id is -1 are
    not written. Two consumer warpgroups take 128 of the tile's weight rows each (4 x 64 was a tie, session 15:
    docs/reports/deepgemm-gluon-fp4-ws.md). Launch: persistent grid of at most one program per SM, num_warps=4 (the
    first consumer warpgroup; the second and the producer warp come from warp_specialize). FOLD_SCALE: as
    fp4_grouped_gemm_kernel's."""
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, x_desc.block_type.shape[0], 32], x_desc.layout)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 32], w_desc.layout)
    ready, empty = _ring_barriers(STAGES, 2)  # "empty": one arrival per consumer warpgroup
    gl.warp_specialize(
        [(_ws_consumer, (x_ring, w_ring, ready, empty, sw_ptr, d_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n,
                         stride_d, 0, GROUP_M, FOLD_SCALE)),
         (_ws_consumer, (x_ring, w_ring, ready, empty, sw_ptr, d_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n,
                         stride_d, 1, GROUP_M, FOLD_SCALE)),
         (_ws_producer, (x_desc, w_desc, x_ring, w_ring, ready, empty, layout_ptr, M, N, K, GROUP_M))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    _invalidate_ring(ready, empty)
