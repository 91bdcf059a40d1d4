"""Gluon kernels of the grouped FP8 x FP4 GEMMs on FP8 tensor cores: the FP4 weights converted to e4m3 in shared
memory with their per-32 scales folded per weight row, the FP8 activations fed to the MMA as they are.

Why (docs/reports/deepgemm-fp8-moe.md, session 19): the bf16-MMA kernels of gemm_gluon_kernel.py spend 2.5-3
instructions per weight value on the FP4 -> bf16 conversion and need an activation pass in front. e2m1 x 2^d is exact in
e4m3 for d in [-8, 6], so a weight row n takes one reference exponent ref[n] = max over K of its scale exponent - 6, its
values become e4m3 x 2^(e - ref[n]), and 2^(ref[n] - 127) multiplies the row's outputs once. With d in [-5, 6] (a row's
scale bytes span at most 11; gemm.fold_fp4_weights checks it) the 8-entry table of a row and 32-block is two words built
by integer multiply-adds, and the conversion is 9 instructions per 8 values (7 since session 45, below). The
activations' per-32 scales stay in the loop: one FMA per accumulator element and 32 of K after an m64nXk32 MMA. Measured
on H200 (same report, session 20 run 1), against the bf16 route: prefill 1.03-1.05x at 128-1,024 rows per expert, decode
at ~8 rows per expert 1.28-1.36x and 0.61 of the device-copy rate, at ~32 rows 0.85-0.87x.

SA_PER_128 (the engine's form since session 21, docs/reports/deepgemm-moe-fold-128.md): activations folded per 128
(fp32 power-of-two scales per 128 of K) let a K step be one 128-deep MMA chain and one FMA per accumulator element,
where per-32 scales need four of each. The math loop was issue-bound (offline: 367 -> 118 SASS instructions per math
warp and K step); H200, session 21 run 2: 1.28-1.29x at prefill, 1.10-1.31x at decode.

Both kernels compute every output element the same way (an FP8 MMA over one 32-block, or with SA_PER_128 one
128-block, then acc += part * sa[token, kb], then times the row's 2^(ref - 127), rounded to bf16), with the weights
as the MMA's B operand (contiguous) or its A operand (masked, swap-AB); the H200 gives both the same bits, in either
form, so a token's row does not depend on the layout that carries it (tests/test_gemm_fp4_e4m3.py). The bf16
route's rows differ from these by rounding, so one weight tensor takes one route in every layout (gemm.py routes on
the folded scales alone).

The weights come in the route's order (reference.fp4_to_fp8_mma_order, made once at load by gemm.fold_fp4_weights;
session 45, docs/reports/deepgemm-moe-fold-128.md): per K step, 32-bit word 4c + q of a row holds the 8 values of k32
chunk c that lane q of a wgmma A fragment holds, with the sign bits where the e4m3 bytes want them. The masked
kernel then loads each thread's words whole (4 ldmatrix.x4 per K step, where the checkpoint's order took 32 16-bit
loads and a pack per word), and the conversion drops two byte permutes per word in both kernels; the contiguous
kernel's converter, which holds a whole row per thread, puts its words back in K order by renaming registers.
Offline (triton 3.6, sm_90a), the masked K loop takes 300 / 376 / 517 SASS instructions at 8 / 16 / 32 tokens (379 /
451 / 594 before). H200, session 45 run 2: masked 1.07-1.11x, contiguous 1.01-1.06x, bitwise the same outputs.

- Contiguous (prefill): fp4_e4m3_contiguous_kernel, one persistent CTA per SM, 128 x 128 output tiles, K in steps
  of 128. A producer warp brings each step's activation tile and packed weight rows by TMA into a ring; the default
  partition (4 warps, one weight row per thread) converts the weights into the slot's e4m3 tile; two math
  warpgroups (64 rows each) run the V4.1 dense kernel's loop on it; the epilogue stores a warpgroup's rows by TMA
  when none is padding, else the used rows by masked pointer stores. On activations folded per 128 and experts of
  128+ rows, 256 x 128 tiles (gemm._contiguous_block_m): each converted weight tile then feeds 256 rows, two 64-row
  sub-tiles per math warpgroup. They start at each expert's first row (a table built on the device by
  contiguous_tile_table_kernel), so none holds two experts' rows; session 38's tiles at multiples of 256 took a K
  sweep per expert where a segment ended mid-tile. H200, session 39: 1.09-1.12x the 128-row tiles at 96 experts of
  128-1,024 rows (session 38's: 1.02-1.07x), 0.92-0.93 / 1.03x torch._scaled_grouped_mm (w13 / w2). The 128-row
  tiles on folded activations (one GPU's prefill: ~48-127 rows per expert) have no producer warp: two feeder
  warpgroups take alternate steps, each issuing its own TMAs (the packed weights 3 of its steps ahead, in a ring of
  8) and converting its step (_contiguous_feed, session 70): twice the conversion in flight, where the one converter
  was latency-bound. H100, session 70 run 3: 1.03 / 1.03x at ~64 rows (w13 / w2), 1.01-1.06x at ~16-96, the same
  bits; the prefill step's MoE experts stage 1.038x.
- Masked (decode): fp4_e4m3_masked_kernel, a warpgroup per (128 weight rows, expert, token tile): a 2-deep TMA
  ring, swap-AB MMAs; the used tokens' rows are stored. Per-32 activations: the conversion into a shared tile,
  m64nBLOCK_Mk32 MMAs. Folded activations (the engine's): each 64-row half converted straight into its MMA's A
  registers (_masked_folded_steps, session 26), no shared tile, fence or CTA barrier in between; H200, session 26
  run 1, against the shared-tile kernel in the same run: 1.01-1.04x at ~8 rows per expert, 1.00-1.08x at ~32,
  decode step of the medium model 1.025 / 1.037x at batch 32 / 64 (docs/reports/deepgemm-moe-fold-128.md). A launch
  takes the experts whose row counts lie in [min_rows, max_rows]: at ~9-32 rows the host splits them in two launches
  (gemm._masked_launches, session 50: 1.11-1.16x at ~16 and ~32 rows), so no expert of up to twice the token tile
  has its weights converted twice. Its CONTIGUOUS form takes the contiguous layout's 128-row blocks as the groups
  (prefill at up to ~48 rows per expert, gemm.CONTIGUOUS_SWAPAB_MAX_ROWS; H100, session 54: 1.11-1.30x the
  contiguous kernel to ~32 rows; H200, session 56: 1.14-1.36x to ~32, 1.02-1.05x at ~48; the same bits).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

from . import gemm_fp4_e4m3_kernel as route_e4m3
from .gemm_gluon_fp8_kernel import _store_tile, _tile_offsets, _ue8m0_to_f32

# The conversion's tables and byte permutes, shared with the Triton kernel (gemm_fp4_e4m3_kernel has their
# description): $2 a word of the route's order, $3 / $4 its 32-block's tables (LUT_*_BASE + offset x LUT_*_STEP) ->
# $0 values 0-3 as e4m3 bytes, $1 values 4-7; 7 instructions where the checkpoint's order took 9 (session 45).
LUT_LO_BASE: gl.constexpr = gl.constexpr(route_e4m3.LUT_LO_BASE)
LUT_LO_STEP: gl.constexpr = gl.constexpr(route_e4m3.LUT_LO_STEP)
LUT_HI_BASE: gl.constexpr = gl.constexpr(route_e4m3.LUT_HI_BASE)
LUT_HI_STEP: gl.constexpr = gl.constexpr(route_e4m3.LUT_HI_STEP)
_E2M1_TO_E4M3_PTX: gl.constexpr = gl.constexpr(
    "{\n.reg .b32 m, t;" + route_e4m3.E2M1_TO_E4M3_PTX_BODY.replace("WORD", "$2").replace("LO", "$3")
    .replace("HI", "$4") + "}\n")

# a thread converts one weight row: its 16 words (128 values) of a K step
_ROW_WORDS = gl.constexpr(gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0]))


@gluon.jit
def _table_words(offsets, BASE: gl.constexpr, STEP: gl.constexpr):
    """One table word ([128, 16] in _ROW_WORDS) per packed word: BASE + STEP x the offset byte of the word's 32-block
    (offsets: int32 [128], a row's 4 bytes of the step; word 4c + q is of block c). The block is a constant of each
    register, so the selects fold away and a thread computes its row's 4 words once."""
    for_k32 = gl.arange(0, 16, layout=gl.SliceLayout(0, _ROW_WORDS))[None, :] // 4
    return gl.where(for_k32 == 0, (BASE + (offsets & 0xFF) * STEP)[:, None],
                    gl.where(for_k32 == 1, (BASE + ((offsets >> 8) & 0xFF) * STEP)[:, None],
                             gl.where(for_k32 == 2, (BASE + ((offsets >> 16) & 0xFF) * STEP)[:, None],
                                      (BASE + ((offsets >> 24) & 0xFF) * STEP)[:, None])))


@gluon.jit
def _convert_rows(words, offsets):
    """words: int32 [128, 16] in _ROW_WORDS, a K step of 128 packed rows in the route's order (word 4c + q: values
    32c + 4q .. + 3 and 32c + 16 + 4q .. + 3); offsets: int32 [128], each row's 4 offset bytes of the step -> the
    e4m3 tile as int32 [128, 32] in K order (4 values per word). A thread holds its row, so putting the words back in
    K order (join, reshape, permute) renames registers and moves no data. A 16-byte load (chunk c's words) gives two
    16-byte stores, so few words stay live: with word 4q + c instead, each store took a word of every load, and the
    converter spilled at 256-row tiles' 56 registers (session 45 run 1: w13 0.885x)."""
    lo = _table_words(offsets, LUT_LO_BASE, LUT_LO_STEP)
    hi = _table_words(offsets, LUT_HI_BASE, LUT_HI_STEP)
    q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [words, lo, hi],
                                         dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    w = gl.permute(gl.reshape(gl.join(q03, q47), [128, 4, 4, 2]), [0, 1, 3, 2])  # (row, c, q, s) -> (row, c, s, q)
    return gl.reshape(w, [128, 32])  # word 8c + 4s + q: values 32c + 16s + 4q .. + 3


@gluon.jit
def _raw_words(raw_ring, STAGES: gl.constexpr):
    """The packed weight ring [STAGES, 128, 64] uint8 (64-byte swizzle) read as int32 [STAGES, 128, 16]."""
    return raw_ring._reinterpret(gl.int32, [STAGES, 128, 16],
                                 gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2))


# ---- contiguous layout (prefill) ----


@gluon.jit
def _row_group(layout_ptr, row, M):
    """layout[row], or -1 (padding) past the last row."""
    return gl.where(row < M, gl.load(layout_ptr + gl.minimum(row, M - 1)), -1)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def contiguous_tile_table_kernel(layout_ptr, table_ptr, M, CHUNK: tl.constexpr):
    """The 256-row tiles of a contiguous layout (int32 [M], segments 128-aligned, padding last): table[0] = their
    count, table[1 + i] = tile i's first row. Each expert's segment is cut into 256-row tiles from its first row, so
    no tile holds two experts' rows; an expert of an odd number of 128-row blocks ends in a tile whose second block
    is the next segment's (or padding, or past M). A block whose first row is padding is all padding and starts no
    tile. One program, CHUNK blocks at a time (run starts and the count carried); table int32 [1 + cdiv(M, 128)]."""
    num_blocks = tl.cdiv(M, 128)
    count = 0
    run_start = 0
    for first in range(0, num_blocks, CHUNK):
        blocks = first + tl.arange(0, CHUNK)
        inside = blocks < num_blocks
        g = tl.load(layout_ptr + blocks * 128, mask=inside, other=-1)
        g_before = tl.load(layout_ptr + blocks * 128 - 128, mask=inside & (blocks > 0), other=-1)
        # each block's run of equal ids starts at its last id change, or at the run carried from the chunk before
        run = tl.maximum(tl.associative_scan(tl.where(g != g_before, blocks, -1), 0, _max), run_start)
        starts = (g >= 0) & ((blocks - run) % 2 == 0)
        tl.store(table_ptr + count + tl.cumsum(starts.to(tl.int32), 0), blocks * 128, mask=starts)
        count += tl.sum(starts.to(tl.int32), 0)
        run_start = tl.max(run, 0)
    tl.store(table_ptr, count)


@gluon.jit
def _contiguous_tile(tile, table_ptr, layout_ptr, M, N, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr):
    """(first row, first column, expert) of the program's `tile`: a 128-row tile is the tile-th in grouped order
    (_tile_offsets; expert -1 = all padding, skipped by every partition); a 256-row tile starts at the row that
    contiguous_tile_table_kernel put in the table, always an expert's."""
    if BLOCK_M == 128:
        off_m, off_n = _tile_offsets(tile, M, N, 128, 128, GROUP_M)
    else:
        index, off_n = _tile_offsets(tile, gl.load(table_ptr), N, 1, 128, GROUP_M)
        off_m = gl.load(table_ptr + 1 + index)
    return off_m, off_n, gl.load(layout_ptr + off_m)


@gluon.jit
def _contiguous_tiles(table_ptr, M, N, BLOCK_M: gl.constexpr):
    """How many output tiles the contiguous kernel has: 128-row blocks, or the table's 256-row tiles, x N / 128."""
    if BLOCK_M == 128:
        num_m = gl.cdiv(M, 128)
    else:
        num_m = gl.load(table_ptr)
    return num_m * gl.cdiv(N, 128)


@gluon.jit
def _contiguous_loads(a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, table_ptr, layout_ptr, M, N, K,
                      GROUP_M: gl.constexpr):
    """The producer warp: per step of the program's tiles, once the slot is empty, the activation tile (into
    "ready", with the converter's arrival) and the tile's expert's packed weight rows (into "raw_ready") by TMA."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    step = 0
    for tile in range(gl.program_id(0), _contiguous_tiles(table_ptr, M, N, BLOCK_M), gl.num_programs(0)):
        off_m, off_n, g = _contiguous_tile(tile, table_ptr, layout_ptr, M, N, BLOCK_M, GROUP_M)
        if g >= 0:  # an all-padding tile is skipped by every partition
            for k in range(K // 128):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(raw_ready.index(slot), w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(slot),
                                                raw_ring.index(slot))
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                step += 1


@gluon.jit
def _contiguous_convert(raw_ring, b_ring, ready, raw_ready, offsets_ptr, table_ptr, layout_ptr, M, N, K,
                        GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr):
    """The default partition (4 warps): per step, once the packed weights are in, their e4m3 tile into the slot, then
    an arrival on "ready". offsets_ptr: int32 words of the offset bytes [G * N, K / 128], loaded two steps ahead."""
    STAGES: gl.constexpr = raw_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, STAGES)
    num_k = K // 128
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, _ROW_WORDS))
    step = 0
    for tile in range(gl.program_id(0), _contiguous_tiles(table_ptr, M, N, BLOCK_M), gl.num_programs(0)):
        _, off_n, g = _contiguous_tile(tile, table_ptr, layout_ptr, M, N, BLOCK_M, GROUP_M)
        if g >= 0:
            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)
            offsets, offsets_next = gl.load(row_offsets), gl.load(row_offsets + gl.minimum(1, num_k - 1))
            for k in range(num_k):
                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))
                slot = step % STAGES
                mbarrier.wait(raw_ready.index(slot), (step // STAGES) & 1)
                tile_words = _convert_rows(raw_words.index(slot).load(_ROW_WORDS), offsets)
                # the slot's B tile is free: the producer waited for "empty" before this step's weights
                b_ring.index(slot).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                offsets, offsets_next = offsets_next, offsets_after
                step += 1


@gluon.jit
def _first_tile_from(tile, n_tiles, table_ptr, layout_ptr, M, N, GROUP_M: gl.constexpr):
    """The program's first 128-row tile at or after `tile` (its stride: the program count) that is not all padding ->
    (tile, first column, expert); tile >= n_tiles when there is none."""
    _, off_n, g = _contiguous_tile(gl.minimum(tile, n_tiles - 1), table_ptr, layout_ptr, M, N, 128, GROUP_M)
    while (tile < n_tiles) & (g < 0):
        tile += gl.num_programs(0)
        _, off_n, g = _contiguous_tile(gl.minimum(tile, n_tiles - 1), table_ptr, layout_ptr, M, N, 128, GROUP_M)
    return tile, off_n, g


@gluon.jit
def _cursor_advance(tile, k, off_n, g, steps, n_tiles, num_k, table_ptr, layout_ptr, M, N, GROUP_M: gl.constexpr):
    """The ring step `steps` after the step at (tile, k) of the program's tiles, all-padding tiles having none."""
    k += steps
    while (k >= num_k) & (tile < n_tiles):
        k -= num_k
        tile, off_n, g = _first_tile_from(tile + gl.num_programs(0), n_tiles, table_ptr, layout_ptr, M, N, GROUP_M)
    return tile, k, off_n, g


@gluon.jit
def _feed_weights(w_desc, raw_ring, raw_ready, raw_slot, tile, k, off_n, g, n_tiles, num_k, table_ptr, layout_ptr, M, N,
                  GROUP_M: gl.constexpr):
    """The packed weights of the cursor's step (tile, k) by TMA into raw slot raw_slot -> the cursor two steps on;
    nothing past the program's last step."""
    if tile < n_tiles:
        mbarrier.expect(raw_ready.index(raw_slot), w_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [g * N + off_n, k * 64], raw_ready.index(raw_slot),
                                        raw_ring.index(raw_slot))
    return _cursor_advance(tile, k, off_n, g, 2, n_tiles, num_k, table_ptr, layout_ptr, M, N, GROUP_M)


@gluon.jit
def _contiguous_feed(a_desc, w_desc, a_ring, raw_ring, b_ring, ready, raw_ready, empty, offsets_ptr, table_ptr,
                     layout_ptr, M, N, K, GROUP_M: gl.constexpr, PART: gl.constexpr):
    """One of the two feeders of 128-row tiles (4 warps each, one weight row per thread; feeder PART takes the ring
    steps s = PART, PART + 2, ...): the packed weights of its step s + RAW - 2 by TMA into raw slot (s - 2) % RAW
    (that slot held its previous step's, read by now; RAW / 2 - 1 of its steps in flight while it converts one),
    then, once slot s % STAGES is empty, step s's activation tile by TMA into "ready", step s's e4m3 tile converted
    into the slot, and its arrival on "ready". A prefetch cursor (tile, k) walks the program's steps RAW - 2 ahead of
    the conversion. The weight rows' offset words are loaded one step ahead
    within the tile. Session 70's first version carried them from the weights' issue in three registers rotated
    across the tile loop, all started as one zero tensor. Triton's front end finds loop-carried values by identity,
    so it carried none of the first: zero offsets at every tile's first step (docs/reports/deepgemm-moe-fold-128.md,
    "Session 70")."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    RAW: gl.constexpr = raw_ring.type.shape[0]
    raw_words = _raw_words(raw_ring, RAW)
    num_k = K // 128
    n_tiles = _contiguous_tiles(table_ptr, M, N, 128)
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, _ROW_WORDS))
    p_tile, p_off_n, p_g = _first_tile_from(gl.program_id(0), n_tiles, table_ptr, layout_ptr, M, N, GROUP_M)
    p_tile, p_k, p_off_n, p_g = _cursor_advance(p_tile, 0, p_off_n, p_g, PART, n_tiles, num_k, table_ptr,
                                                layout_ptr, M, N, GROUP_M)
    for i in range(RAW // 2 - 1):  # this feeder's first steps: PART, PART + 2, ...
        p_tile, p_k, p_off_n, p_g = _feed_weights(w_desc, raw_ring, raw_ready, PART + 2 * i, p_tile, p_k, p_off_n,
                                                  p_g, n_tiles, num_k, table_ptr, layout_ptr, M, N, GROUP_M)
    step = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n, g = _contiguous_tile(tile, table_ptr, layout_ptr, M, N, 128, GROUP_M)
        if g >= 0:
            # the weight rows' offset words, one of this feeder's steps ahead within the tile (as the converter's)
            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * num_k
            k0 = (PART + step) % 2
            offsets = gl.load(row_offsets + gl.minimum(k0, num_k - 1))
            for k in range(k0, num_k, 2):
                s = step + k
                offsets_next = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))
                p_tile, p_k, p_off_n, p_g = _feed_weights(w_desc, raw_ring, raw_ready, (s + RAW - 2) % RAW, p_tile, p_k,
                                                          p_off_n, p_g, n_tiles, num_k, table_ptr, layout_ptr, M, N,
                                                          GROUP_M)
                slot = s % STAGES
                mbarrier.wait(empty.index(slot), ((s // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(a_desc, [off_m, k * 128], ready.index(slot), a_ring.index(slot))
                mbarrier.wait(raw_ready.index(s % RAW), (s // RAW) & 1)
                tile_words = _convert_rows(raw_words.index(s % RAW).load(_ROW_WORDS), offsets)
                b_ring.index(slot).store(tile_words)
                fence_async_shared()
                mbarrier.arrive(ready.index(slot), count=1)
                offsets = offsets_next
            step += num_k


@gluon.jit
def _store_rows(acc, d_desc, d_smem, d_ptr, layout_ptr, off_m, off_n, M, stride_d, MMA: gl.constexpr):
    """The 64 output rows at off_m (acc column-scaled) whose layout id is not -1: when all are, as one TMA box from
    d_smem (the warpgroup's own buffer) that drains under the next tile's MMAs, else by masked pointer stores (an
    expert's last, partial rows); padding rows stay untouched."""
    offs_m = off_m + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
    cols = off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, MMA))
    row_groups = gl.load(layout_ptr + offs_m, mask=offs_m < M, other=-1)
    if gl.min(row_groups, axis=0) >= 0:
        _store_tile(acc, d_desc, d_smem, off_m, off_n)
    else:
        gl.store(d_ptr + offs_m.to(gl.int64)[:, None] * stride_d + cols[None, :], acc.to(gl.bfloat16),
                 mask=(row_groups >= 0)[:, None])


@gluon.jit
def _math_tile(a_ring, b_ring, ready, empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr, layout_ptr, off_m, off_n, g,
               used_0, step, M, N, K, stride_sa, stride_d, ROW0: gl.constexpr, SA_PER_128: gl.constexpr):
    """_contiguous_math's K loop and epilogue of one tile of expert g, from ring step `step`; returns the step after.
    used_0 / used_1: whether the warpgroup's first / second sub-tile holds g's rows (a sub-tile of padding or of the
    next segment: no MMA, no store); 128-row tiles pass used_0 = True (their caller has checked it), which keeps their
    SASS the same as before the tile table."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    SUB_TILES: gl.constexpr = a_ring.type.shape[1] // 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    num_k = K // 128
    zero = gl.zeros([64, 128], gl.float32, mma)
    offs_m = off_m + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    sa_rows = sa_ptr + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_sa
    wa = gl.load(sa_rows)
    acc = gl.zeros([64, 128], gl.float32, mma)
    if SUB_TILES == 2:
        used_1 = _row_group(layout_ptr, off_m + ROW0 + 128, M) == g
        sa_rows_1 = sa_ptr + gl.minimum(offs_m + 128, M - 1).to(gl.int64) * stride_sa
        wa_1 = gl.load(sa_rows_1)
        acc_1 = gl.zeros([64, 128], gl.float32, mma)
    for k in range(num_k):
        wa_next = gl.load(sa_rows + gl.minimum(k + 1, num_k - 1))
        if SUB_TILES == 2:
            wa_1_next = gl.load(sa_rows_1 + gl.minimum(k + 1, num_k - 1))
        slot = step % STAGES
        mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
        a_tile = a_ring.index(slot).slice(ROW0, 64, dim=0)
        b_tile = b_ring.index(slot)
        if used_0:
            if SA_PER_128:
                part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                    a_tile, b_tile.permute((1, 0)), zero, use_acc=False, is_async=True),))
                acc = acc + part * wa[:, None]
            else:
                for j in gl.static_range(4):
                    a_frag = a_tile.slice(32 * j, 32, dim=1).load(a_op)
                    part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                        a_frag, b_tile.slice(32 * j, 32, dim=1).permute((1, 0)), zero, use_acc=False,
                        is_async=True),))
                    acc = acc + part * _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)[:, None]
        if SUB_TILES == 2:
            if used_1:
                part = warpgroup_mma_wait(0, deps=(warpgroup_mma(
                    a_ring.index(slot).slice(ROW0 + 128, 64, dim=0), b_tile.permute((1, 0)), zero,
                    use_acc=False, is_async=True),))
                acc_1 = acc_1 + part * wa_1[:, None]
        mbarrier.arrive(empty.index(slot), count=1)
        wa = wa_next
        if SUB_TILES == 2:
            wa_1 = wa_1_next
        step += 1
    if used_0:
        colscale = gl.load(colscale_ptr + g * N + off_n + gl.arange(0, 128, layout=gl.SliceLayout(0, mma)))
        _store_rows(acc * colscale[None, :], d_desc, d_smem, d_ptr, layout_ptr, off_m + ROW0, off_n, M,
                    stride_d, mma)
        if SUB_TILES == 2:
            if used_1:
                _store_rows(acc_1 * colscale[None, :], d_desc, d_smem, d_ptr, layout_ptr, off_m + ROW0 + 128,
                            off_n, M, stride_d, mma)
    return step


@gluon.jit
def _contiguous_math(a_ring, b_ring, ready, empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr, table_ptr, layout_ptr,
                     M, N, K, stride_sa, stride_d, GROUP_M: gl.constexpr, ROW0: gl.constexpr,
                     SA_PER_128: gl.constexpr):
    """Rows ROW0 + [0, 64) of every tile and, in 256-row tiles, ROW0 + 128 + [0, 64): 64-row sub-tiles, each with
    its accumulator (the two warpgroups take alternate sub-tiles, so a 256-row tile that ends its expert after one
    128-row block keeps both busy): per K step and sub-tile, with SA_PER_128 one m64n128k128 MMA (A and B from shared
    memory, B the converted tile) and acc += part * sa[m, k]; without it (128-row tiles only) per 32 of K one
    m64n128k32 MMA (A by ldmatrix) and acc += part * sa[m, kb]. The epilogue scales each column by 2^(ref - 127) and
    stores the used rows (_store_rows). A sub-tile's rows are one expert's or padding (segments are 128-aligned and
    end in their padding); one whose first row is not the tile's expert's (padding, or the next segment's in a
    256-row tile) gets no MMA and no store, and a warpgroup whose first sub-tile is such only passes the ring's
    barriers. Experts of at most 64 rows (~64 on average at 1-GPU prefill: 4,096 tokens x 6 / 384 experts) leave
    warpgroup 1 of a 128-row tile idle. sa_ptr: int32 words of the UE8M0 bytes [M, K / 32] (row stride stride_sa
    words), or with SA_PER_128 fp32 scales [M, K / 128] of activations folded per 128 (reference.fold_ue8m0_to_128)."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    SUB_TILES: gl.constexpr = BLOCK_M // 128
    gl.static_assert(SA_PER_128 or SUB_TILES == 1, "256-row tiles take activations folded per 128")
    step = 0
    for tile in range(gl.program_id(0), _contiguous_tiles(table_ptr, M, N, BLOCK_M), gl.num_programs(0)):
        off_m, off_n, g = _contiguous_tile(tile, table_ptr, layout_ptr, M, N, BLOCK_M, GROUP_M)
        own_g = _row_group(layout_ptr, off_m + ROW0, M)
        if g >= 0:
            if SUB_TILES == 1:
                if own_g != g:  # padding: keep the ring's counts only
                    for k in range(K // 128):
                        slot = step % STAGES
                        mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                        mbarrier.arrive(empty.index(slot), count=1)
                        step += 1
                else:
                    step = _math_tile(a_ring, b_ring, ready, empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr,
                                      layout_ptr, off_m, off_n, g, True, step, M, N, K, stride_sa, stride_d,
                                      ROW0, SA_PER_128)
            else:
                # one K loop whether or not the warpgroup has rows here, the MMAs in branches on the loaded ids: with
                # the first MMA unguarded (as it is where the branch is known true) ptxas spilled ~340 instructions
                # per warpgroup in the loop at 216 registers (session 38)
                step = _math_tile(a_ring, b_ring, ready, empty, d_desc, d_smem, d_ptr, sa_ptr, colscale_ptr,
                                  layout_ptr, off_m, off_n, g, own_g == g, step, M, N, K, stride_sa, stride_d, ROW0,
                                  SA_PER_128)
    tma.store_wait(pendings=0)


@gluon.jit
def fp4_e4m3_contiguous_kernel(a_desc, w_desc, d_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, table_ptr,
                               layout_ptr, M, N, K, stride_sa, stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                               SA_PER_128: gl.constexpr = False, FEEDERS: gl.constexpr = False):
    """d[m, n] = colscale[g, n] * sum over 32-blocks kb of sa[m, kb] * (a[m, kb] . w'[g, n, kb]) for g = layout[m]
    >= 0 (module docstring). a_desc: e4m3 [M, K] in [BLOCK_M, 128] boxes, BLOCK_M 128 or 256 (the tiles' rows; 256 with
    SA_PER_128 only); w_desc: packed e2m1 uint8 [G * N, K / 2] in the route's order, in [128, 64] boxes, 64-byte
    swizzle; d bf16 [M, N] (row stride stride_d), also as d_desc in [64, 128] boxes; offsets int32 [G * N, K / 128]; sa
    int32 words [M, K / 128] (row stride stride_sa), or with SA_PER_128 fp32 [M, K / 128] (activations folded per 128);
    colscale fp32 [G * N]; layout int32 [M], segments 128-aligned; table int32: for 256-row tiles
    contiguous_tile_table_kernel's (read on the device: no host sync), unused for 128; N % 128 == 0, K % 128 == 0.
    Persistent: at most one program per SM; launch with num_warps=4 (the converter, or the first feeder) and maxnreg
    128."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, 128], a_desc.layout)
    # FEEDERS (the launcher's choice: 128-row tiles on activations folded per 128): two feeders, each with STAGES - 1
    # steps of packed weights in flight (_contiguous_feed), PRODUCER_REGS registers each; else the producer warp
    # (PRODUCER_REGS) and one converter
    gl.static_assert(not FEEDERS or (BLOCK_M == 128 and SA_PER_128))
    RAW: gl.constexpr = 2 * STAGES if FEEDERS else STAGES
    raw_ring = gl.allocate_shared_memory(w_desc.dtype, [RAW, 128, 64], w_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    b_ring_e4m3 = b_ring._reinterpret(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)  # A's 128-byte swizzle
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    raw_ready = gl.allocate_shared_memory(gl.int64, [RAW, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=2)  # the activation TMA's expect-tx and the converter's (feeder's) arrival
        mbarrier.init(raw_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one per math warpgroup
    for s in gl.static_range(STAGES, RAW):
        mbarrier.init(raw_ready.index(s), count=1)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    if FEEDERS:
        gl.warp_specialize(
            [(_contiguous_feed, (a_desc, w_desc, a_ring, raw_ring, b_ring, ready, raw_ready, empty, offsets_ptr,
                                 table_ptr, layout_ptr, M, N, K, GROUP_M, 0)),
             (_contiguous_feed, (a_desc, w_desc, a_ring, raw_ring, b_ring, ready, raw_ready, empty, offsets_ptr,
                                 table_ptr, layout_ptr, M, N, K, GROUP_M, 1)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                 colscale_ptr, table_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0,
                                 SA_PER_128)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                 colscale_ptr, table_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64,
                                 SA_PER_128))],
            [4, 4, 4], [PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS])
    else:
        gl.warp_specialize(
            [(_contiguous_convert, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, table_ptr, layout_ptr, M, N, K,
                                    GROUP_M, BLOCK_M)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(0), d_ptr, sa_ptr,
                                 colscale_ptr, table_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 0,
                                 SA_PER_128)),
             (_contiguous_math, (a_ring, b_ring_e4m3, ready, empty, d_desc, d_smem.index(1), d_ptr, sa_ptr,
                                 colscale_ptr, table_ptr, layout_ptr, M, N, K, stride_sa, stride_d, GROUP_M, 64,
                                 SA_PER_128)),
             (_contiguous_loads, (a_desc, w_desc, a_ring, raw_ring, ready, raw_ready, empty, table_ptr, layout_ptr, M,
                                  N, K, GROUP_M))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(raw_ready.index(s))
        mbarrier.invalidate(empty.index(s))
    for s in gl.static_range(STAGES, RAW):
        mbarrier.invalidate(raw_ready.index(s))


# ---- masked layout (decode) ----


@gluon.jit
def _masked_issue(w_desc, x_desc, w_ring, x_ring, ready, t, w_row, x_row, step0):
    """TMA ring step t into ring slot (step0 + t) % STAGES (step0: the ring steps of the program's earlier token tiles):
    K step t's packed weights [128, 64 bytes] and activations [BLOCK_M, 128] (2-D descriptors), or with 3-D ones (K
    step outermost, S steps a box) K steps S t .. S t + S - 1 ([S, 128, 64], [S, BLOCK_M, 128])."""
    slot = (step0 + t) % w_ring.type.shape[0]
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    if len(w_desc.block_type.shape) == 3:
        S: gl.constexpr = w_desc.block_type.shape[0]
        tma.async_copy_global_to_shared(w_desc, [t * S, w_row, 0], ready.index(slot), w_ring.index(slot))
        tma.async_copy_global_to_shared(x_desc, [t * S, x_row, 0], ready.index(slot), x_ring.index(slot))
    else:
        tma.async_copy_global_to_shared(w_desc, [w_row, t * 64], ready.index(slot), w_ring.index(slot))
        tma.async_copy_global_to_shared(x_desc, [x_row, t * 128], ready.index(slot), x_ring.index(slot))


@gluon.jit
def _masked_ring(w_desc, x_desc, STAGES: gl.constexpr):
    """The masked kernel's TMA ring: a slot per descriptor box (packed weights [128, 64 bytes] and activations
    [BLOCK_M, 128], or [S, ...] of each: S K steps a slot) and one "ready" mbarrier per slot."""
    if len(w_desc.block_type.shape) == 3:
        S: gl.constexpr = w_desc.block_type.shape[0]
        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, S, 128, 64], w_desc.layout)
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, S, x_desc.block_type.shape[1], 128], x_desc.layout)
    else:
        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, x_desc.block_type.shape[0], 128], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    return w_ring, x_ring, ready


@gluon.constexpr_function
def _slot_steps(ring_shape):
    """K steps per slot of a masked ring: S of [STAGES, S, rows, cols] (3-D descriptors), else 1."""
    return ring_shape[1] if len(ring_shape) == 4 else 1


@gluon.jit
def _masked_steps(ring, dtype: gl.constexpr, cols: gl.constexpr, swizzle: gl.constexpr):
    """A masked ring ([STAGES, rows, *], or [STAGES, S, rows, *] in the 3-D descriptors' layout) read as [STAGES x S,
    rows, cols] of `dtype` in the same swizzle: index slot x S + j is K step j of the slot."""
    STAGES: gl.constexpr = ring.type.shape[0]
    S: gl.constexpr = _slot_steps(ring.type.shape)
    return ring._reinterpret(dtype, [STAGES * S, ring.type.shape[-2], cols],
                             gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=dtype.primitive_bitwidth,
                                                  rank=2))


@gluon.jit
def _masked_fill(w_desc, x_desc, w_ring, x_ring, ready, num_t, w_row, x_row, step0):
    """The tile's first STAGES - 1 ring steps (of num_t); step t then refills the slot step t - 1 read."""
    for s in gl.static_range(w_ring.type.shape[0] - 1):
        if s < num_t:
            _masked_issue(w_desc, x_desc, w_ring, x_ring, ready, s, w_row, x_row, step0)


@gluon.jit
def _masked_store(acc_lo, acc_hi, d_ptr, colscale_ptr, block, n0, w_row, tokens, rows_used, stride_d_g, stride_d_m):
    """The tile's used token rows of d (rows of d's block `block`): each 64-row half's accumulator (fp32 [64,
    BLOCK_M], weight rows x tokens) times its rows' column scales, rounded to bf16."""
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_lo.type.layout))
    keep = (tokens < rows_used)[None, :]
    out = d_ptr + block.to(gl.int64) * stride_d_g + tokens.to(gl.int64)[None, :] * stride_d_m
    scale_lo = gl.load(colscale_ptr + w_row + rows)[:, None]
    scale_hi = gl.load(colscale_ptr + w_row + 64 + rows)[:, None]
    gl.store(out + (n0 + rows)[:, None], (acc_lo * scale_lo).to(gl.bfloat16), mask=keep)
    gl.store(out + (n0 + 64 + rows)[:, None], (acc_hi * scale_hi).to(gl.bfloat16), mask=keep)


# The folded masked path's A operand, converted in registers (docs/reports/deepgemm-moe-fold-128.md, sessions 25-26,
# 45). Half a K step's words, int32 [64 rows, 16] in the route's order: a thread (q = lane % 4, g = lane / 4 + 16 x
# warp) holds rows g and g + 8 and words q, 4 + q, 8 + q, 12 + q of each (the load lowers to 4 ldmatrix.x4 per K
# step, offline); word 4c + q holds k32 chunk c's values 32c + 4q .. + 3 and 32c + 16 + 4q .. + 3, the thread's part
# of the wgmma A fragment.
_HALF_WORDS: gl.constexpr = gl.DistributedLinearLayout(
    reg_bases=[[0, 4], [0, 8], [8, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])
_IDENTITY_PTX: gl.constexpr = gl.constexpr("mov.b32 $0, $1;")


@gluon.jit
def _fragment_words(w_ring, step, half: gl.constexpr):
    """Half `half` (rows 64 x half ..) of a K step's packed weights (`step`: index into _masked_steps's view) -> each
    thread's A-fragment words (int32 [64, 16] in _HALF_WORDS), as they lie in shared memory."""
    words = _masked_steps(w_ring, gl.int32, 16, 64).index(step).slice(64 * half, 64, dim=0)
    return words.load(_HALF_WORDS)


@gluon.jit
def _register_operand(words, offsets, A_OP: gl.constexpr):
    """_fragment_words's words and their rows' offset bytes (int32 [64], one byte per 32-block) -> the e4m3 [64, 128]
    wgmma A operand in registers: the 8-value conversion gives each word's two fragment registers, which join,
    reshape and permute put in the operand's order (k / 4 = 8c + 4s + q) with no data movement."""
    chunk = gl.arange(0, 16, gl.SliceLayout(0, _HALF_WORDS))[None, :] // 4  # word 4c + q: chunk c, a register constant
    offset = (offsets[:, None] >> (8 * chunk)) & 0xFF
    lo, hi = LUT_LO_BASE + offset * LUT_LO_STEP, LUT_HI_BASE + offset * LUT_HI_STEP  # the 32-block's tables
    q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [words, lo, hi],
                                         dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    w = gl.join(q03, q47)  # [64, 16, 2]: (row, 4c + q, s), s = first or second 16 of the chunk
    w = gl.permute(gl.reshape(w, [64, 4, 4, 2]), [0, 1, 3, 2])  # (row, c, s, q): a register's k / 4 = 8c + 4s + q
    w = gl.reshape(w, [64, 32])
    w = gl.reshape(gl.join(gl.join(w, w), gl.join(w, w)), [64, 128])  # each word for its 4 values
    a = gl.inline_asm_elementwise(_IDENTITY_PTX, "=r,r,r,r,r", [w], dtype=gl.float8e4nv, is_pure=True, pack=4)
    return gl.convert_layout(a, A_OP, assert_trivial=True)


@gluon.jit
def _contiguous_block(layout_ptr, block, M):
    """(expert, real rows) of a contiguous layout's 128-row block: its rows are one expert's, then padding (-1), so the
    largest id is the expert (-1: all padding) and the ids >= 0 count its rows."""
    rows = block * 128 + gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    ids = gl.load(layout_ptr + rows, mask=rows < M, other=-1)
    return gl.max(ids, 0), gl.sum((ids >= 0).to(gl.int32), 0)


@gluon.jit
def _masked_folded_step(w_ring, x_ring, ready, t, j, step0, num_k, offsets_lo_ptr, offsets_hi_ptr, off_lo, off_hi,
                        sa_tile, sa_rows, acc_lo, acc_hi, zero, a_op: gl.constexpr, WAIT: gl.constexpr):
    """K step j of ring step t (a slot of S steps) of the folded loop: each 64-row half's weights (offset words off_lo,
    off_hi) converted into its MMA's A registers, the first half's MMA running under the second half's conversion,
    then acc += part * sa[token, k] -> (acc_lo, acc_hi, the next step's offset words). WAIT: the slot's wait here,
    after those loads are issued (else the caller's)."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    S: gl.constexpr = _slot_steps(w_ring.type.shape)
    k = t * S + j
    ahead = gl.minimum(k + 1, num_k - 1)
    off_lo_next, off_hi_next = gl.load(offsets_lo_ptr + ahead), gl.load(offsets_hi_ptr + ahead)
    slot = (step0 + t) % STAGES
    if WAIT:
        mbarrier.wait(ready.index(slot), ((step0 + t) // STAGES) & 1)
    b = _masked_steps(x_ring, x_ring.dtype, 128, 128).index(slot * S + j).permute((1, 0))
    a_lo = _register_operand(_fragment_words(w_ring, slot * S + j, 0), off_lo, a_op)
    lo_mma = warpgroup_mma(a_lo, b, zero, use_acc=False, is_async=True)
    a_hi = _register_operand(_fragment_words(w_ring, slot * S + j, 1), off_hi, a_op)
    hi_mma = warpgroup_mma(a_hi, b, zero, use_acc=False, is_async=True)
    wa = gl.load(sa_tile + k + sa_rows)  # under the MMAs
    part_lo, part_hi = warpgroup_mma_wait(0, deps=(lo_mma, hi_mma))
    acc_lo = acc_lo + part_lo * wa[None, :]
    acc_hi = acc_hi + part_hi * wa[None, :]
    return acc_lo, acc_hi, off_lo_next, off_hi_next


@gluon.jit
def _masked_folded_steps(w_ring, x_ring, ready, w_desc, x_desc, offsets_ptr, sa_ptr, num_k, w_row, x_row, m0,
                         block_rows, K, stride_sa, step0, mma: gl.constexpr, SLOT_UNROLLED: gl.constexpr):
    """SA_PER_128's K loop (_masked_folded_step per K step: no shared tile, fence or CTA barrier between the
    conversion and the MMA) -> (acc_lo, acc_hi). A ring slot holds S K steps, so its refill, the copies' handshakes
    and the CTA barriers the compiler puts around them come once per S steps; SLOT_UNROLLED: a slot's steps unrolled
    (fewer instructions per step; at 32 tokens they spill at the 128-register cap, so a loop there). The ring stays
    safe without a CTA barrier of its own: a slot is refilled after the step that read it waited for its MMAs, and an
    MMA with register A operands starts only once all four warps have issued it, that is, after every warp's loads of
    the slot. block_rows: the rows of x's block (tokens past them read its last row's activation scales)."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    S: gl.constexpr = _slot_steps(w_ring.type.shape)
    BLOCK_M: gl.constexpr = x_ring.type.shape[-2]
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    half_rows = gl.arange(0, 64, layout=gl.SliceLayout(1, _HALF_WORDS))
    offsets_lo_ptr = offsets_ptr + (w_row + half_rows).to(gl.int64) * (K // 128)
    offsets_hi_ptr = offsets_ptr + (w_row + 64 + half_rows).to(gl.int64) * (K // 128)
    # the tile's activation scales through one 64-bit base and 32-bit offsets (64-bit pointers per token would hold
    # two registers each across the loop; offline, 32 tokens spilled at 128 registers with them)
    sa_tile = sa_ptr + x_row.to(gl.int64) * stride_sa
    sa_rows = gl.minimum(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma)), block_rows - 1 - m0) * stride_sa
    zero = gl.zeros([64, BLOCK_M], gl.float32, mma)
    acc_lo = gl.zeros([64, BLOCK_M], gl.float32, mma)
    acc_hi = gl.zeros([64, BLOCK_M], gl.float32, mma)
    off_lo, off_hi = gl.load(offsets_lo_ptr), gl.load(offsets_hi_ptr)
    num_t = num_k // S
    for t in range(num_t):
        if t + STAGES - 1 < num_t:
            _masked_issue(w_desc, x_desc, w_ring, x_ring, ready, t + STAGES - 1, w_row, x_row, step0)
        if SLOT_UNROLLED:
            for j in gl.static_range(S):
                acc_lo, acc_hi, off_lo, off_hi = _masked_folded_step(
                    w_ring, x_ring, ready, t, j, step0, num_k, offsets_lo_ptr, offsets_hi_ptr, off_lo, off_hi, sa_tile,
                    sa_rows, acc_lo, acc_hi, zero, a_op, j == 0)
        else:
            mbarrier.wait(ready.index((step0 + t) % STAGES), ((step0 + t) // STAGES) & 1)
            for j in range(S):
                acc_lo, acc_hi, off_lo, off_hi = _masked_folded_step(
                    w_ring, x_ring, ready, t, j, step0, num_k, offsets_lo_ptr, offsets_hi_ptr, off_lo, off_hi, sa_tile,
                    sa_rows, acc_lo, acc_hi, zero, a_op, False)
    return acc_lo, acc_hi


@gluon.jit
def fp4_e4m3_masked_kernel(w_desc, x_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, rows_ptr, min_rows, max_rows,
                           max_m, N, K, stride_sa, stride_d_g, stride_d_m, M, STAGES: gl.constexpr,
                           SA_PER_128: gl.constexpr = False, SLOT_UNROLLED: gl.constexpr = True,
                           CONTIGUOUS: gl.constexpr = False):
    """d[g, m, n] = colscale[g, n] * sum over 32-blocks kb of sa[g, m, kb] * (x[g, m, kb] . w'[g, n, kb]) for m <
    masked_m[g] (rows_ptr: masked_m int32 [G]), for the groups with min_rows <= masked_m[g] <= max_rows (a launch per
    row-count class: the others' programs exit); other rows untouched. w_desc: packed e2m1 uint8 [G * N, K / 2] in
    the route's order, in [128, 64] boxes (64-byte swizzle); x_desc: e4m3 [G * max_m, K] in [BLOCK_M, 128] boxes; or
    (SA_PER_128 only) 3-D views, K step outermost, [K / 128, G * N, 64] in [S, 128, 64] boxes and [K / 128, G *
    max_m, 128] in [S, BLOCK_M, 128] boxes: a ring slot of S K steps (S divides K / 128). offsets int32 [G * N, K /
    128]; sa int32 words [G * max_m, K / 128] (row stride stride_sa); colscale fp32 [G * N]; d bf16 [G, max_m, N]. N
    % 128 == 0, K % 128 == 0. Grid (cdiv(max_m, BLOCK_M) or 1, N / 128, G); num_warps=4. Per step: the ring slot's
    weights converted into one shared tile (each thread a row), then per 32 of K two swap-AB MMAs (weight rows 0-63
    and 64-127 as A, the activations as B) and acc += part * sa[token, kb]. SA_PER_128: sa fp32 [G * max_m, K / 128]
    (activations folded per 128), each half's weights converted into its MMA's A registers (_masked_folded_steps), one
    pair of 128-deep MMAs and one FMA per element per K step; launch with maxnreg 128 at 16-32 tokens (4 CTAs per SM),
    96 at 8 (5). SLOT_UNROLLED: a slot's K steps unrolled, else a loop (_masked_folded_steps).
    CONTIGUOUS (SA_PER_128 only): the contiguous layout, x [M, K], d [M, N], rows_ptr its grouped_layout int32 [M],
    max_m = 128 and the grid's last axis cdiv(M, 128): program_id(2) is a 128-row block, its rows one expert's (g),
    then padding (segments 128-aligned); masked_m[g] above reads the block's real rows. M: x's rows, read by the
    CONTIGUOUS form only; it comes last among the runtime arguments because placed before N it changed the masked
    launches' register allocation (the 32-token tile spilled 32 bytes instead of 8, offline)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[-2]
    w_ring, x_ring, ready = _masked_ring(w_desc, x_desc, STAGES)
    S: gl.constexpr = _slot_steps(w_ring.type.shape)
    if not SA_PER_128:
        w_tile = gl.allocate_shared_memory(gl.int32, [128, 32],
                                           gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
        w_e4m3 = w_tile._reinterpret(x_desc.dtype, [128, 128],
                                     gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))

    # token tiles vary fastest in the grid: an expert's tiles of the same weight rows run together, and all but the
    # first read the weights from L2 (with the tile axis last, each came back from HBM a wave later). A program takes
    # token tiles program_id(0), + num_programs(0), ...: the grid's first axis covers max_m (one tile each) or, at
    # few rows per expert, is 1 (a program per expert and weight rows, looping over its tiles: no programs that
    # only read masked_m and exit); the ring's phases run on across a program's tiles (step0).
    n0 = gl.program_id(1) * 128
    block = gl.program_id(2)  # x's and d's rows block * max_m ..: the expert's (masked) or the 128-row block's
    if CONTIGUOUS:
        gl.static_assert(SA_PER_128, "the contiguous layout takes the folded loop")
        g, rows_used = _contiguous_block(rows_ptr, block, M)
        block_rows = gl.minimum(max_m, M - block * max_m)
    else:
        g = block
        rows_used = gl.load(rows_ptr + g)
        block_rows = max_m
    rows_end = rows_used
    if (rows_used < min_rows) | (rows_used > max_rows):
        rows_end = 0
    num_k = K // 128
    w_row = g * N + n0
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 32])
    step0 = 0
    for m0 in range(gl.program_id(0) * BLOCK_M, rows_end, gl.num_programs(0) * BLOCK_M):
        x_row = block * max_m + m0
        _masked_fill(w_desc, x_desc, w_ring, x_ring, ready, num_k // S, w_row, x_row, step0)
        tokens = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        if SA_PER_128:
            acc_lo, acc_hi = _masked_folded_steps(w_ring, x_ring, ready, w_desc, x_desc, offsets_ptr, sa_ptr, num_k,
                                                  w_row, x_row, m0, block_rows, K, stride_sa, step0, mma, SLOT_UNROLLED)
        else:
            gl.static_assert(S == 1, "per-32 activations take one K step per ring slot")
            row_offsets = offsets_ptr + (w_row + gl.arange(0, 128, layout=gl.SliceLayout(1, _ROW_WORDS))).to(
                gl.int64) * (K // 128)
            sa_cols = sa_ptr + (g * max_m + gl.minimum(tokens, max_m - 1)).to(gl.int64) * stride_sa
            zero = gl.zeros([64, BLOCK_M], gl.float32, mma)
            acc_lo = gl.zeros([64, BLOCK_M], gl.float32, mma)
            acc_hi = gl.zeros([64, BLOCK_M], gl.float32, mma)
            offsets, wa = gl.load(row_offsets), gl.load(sa_cols)
            for k in range(num_k):
                # the slot read in step k - 1 is free (its MMAs were waited for): refill it a ring ahead
                if k + STAGES - 1 < num_k:
                    _masked_issue(w_desc, x_desc, w_ring, x_ring, ready, k + STAGES - 1, w_row, x_row, step0)
                ahead = gl.minimum(k + 1, num_k - 1)
                offsets_next, wa_next = gl.load(row_offsets + ahead), gl.load(sa_cols + ahead)
                slot = (step0 + k) % STAGES
                mbarrier.wait(ready.index(slot), ((step0 + k) // STAGES) & 1)
                words = _masked_steps(w_ring, gl.int32, 16, 64).index(slot).load(_ROW_WORDS)
                w_tile.store(_convert_rows(words, offsets))
                fence_async_shared()
                gl.thread_barrier()  # every thread's rows of the tile are written before the MMAs read it
                x_tile = _masked_steps(x_ring, x_ring.dtype, 128, 128).index(slot)
                for j in gl.static_range(4):
                    b = x_tile.slice(32 * j, 32, dim=1).permute((1, 0))
                    lo_mma = warpgroup_mma(w_e4m3.slice(0, 64, dim=0).slice(32 * j, 32, dim=1), b, zero,
                                           use_acc=False, is_async=True)
                    hi_mma = warpgroup_mma(w_e4m3.slice(64, 64, dim=0).slice(32 * j, 32, dim=1), b, zero,
                                           use_acc=False, is_async=True)
                    part_lo, part_hi = warpgroup_mma_wait(0, deps=(lo_mma, hi_mma))
                    fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)[None, :]
                    acc_lo = acc_lo + part_lo * fa
                    acc_hi = acc_hi + part_hi * fa
                offsets, wa = offsets_next, wa_next
        _masked_store(acc_lo, acc_hi, d_ptr, colscale_ptr, block, n0, w_row, tokens, rows_used, stride_d_g,
                      stride_d_m)
        step0 += num_k // S
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
