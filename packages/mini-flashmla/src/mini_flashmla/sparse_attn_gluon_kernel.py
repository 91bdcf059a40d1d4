"""Gluon kernel of sparse MLA attention (prefill, and decode split over slots): bf16 rows, or the paged quantized
cache (FP8 window rows, FP4 compressed rows). Warp-specialized: a producer warpgroup gathers (and dequantizes)
64-slot blocks into a 2-deep ring of bf16 tiles while two consumer warpgroups run the block's MMAs and softmax.

Why: the Triton kernel (sparse_attn_kernel.py) spends ~5.5 us (bf16 rows) to ~11 us (quantized rows) per 64-slot
block against ~1 us of tensor-core work (docs/reports/flashmla-sparse-attention.md): it lays the 64 x 64 QK^T MMA out
over both warpgroups with the same rows (the QK half of the FLOPs done twice), holds the gathered rows in registers
across the dequantization (255 registers and spills), and serializes gather, dequantization and MMAs. A first Gluon
version (session 11, in one partition) fixed the first two; its breakdown (benchmarks/exp_flashmla_gluon_breakdown.py,
docs/reports/flashmla-gluon.md) showed the gathers (bf16 rows) and the dequantization (quantized rows) still in
series with the MMAs. Here they run in their own warps:

- Producer (worker partition, PRODUCER_WARPS warps): for each block, its 64 row ids (staged ahead in a shared-memory
  ring, where the consumers read their masks too), then
  - bf16 rows: cp.async straight into the tile, completion tracked by the tile's `full` mbarrier (cp.async's own
    arrive, one per producer thread), so up to two blocks' gathers are in flight;
  - quantized rows: chunk by chunk (8 window or 16 compressed rows), cp.async of the raw words into a ring of
    STAGES staging buffers, LOOKAHEAD chunks ahead of the one being converted (also across block boundaries), each
    thread copying exactly the words it converts later and waiting for its own commit groups; then shared ->
    registers -> bf16 into the tile by per-word PTX, exactly cache_layout's unpack (every value has at most 6
    significant bits: the scale multiply is exact in bf16), in layouts whose 16-byte shared loads and stores are
    free of bank conflicts.
  It waits on the tile's `empty` mbarrier before writing into it. The consumers' proxy fence after every wait on
  `full` orders the tile's generic-proxy writes (cp.async or stores) before their wgmma reads.
- Consumers (two partitions of one warpgroup each) taking turns, FlashMLA-style: warpgroup 0 owns the even blocks,
  warpgroup 1 the odd ones. The owner runs the block's whole S = Q K^T (m64n64k512, Q [64, 512] bf16 in shared
  memory for the whole walk) and its softmax, a row reduction within one warpgroup; it publishes the running max and
  P (bf16; both warpgroups' PV takes it as its register operand, the other warpgroup loading it by ldmatrix) and
  arrives on `pub`. Both warpgroups run PV on their own 256 output columns of every block (a 128-register fp32
  accumulator per thread), rescaled by every block's alpha, so both follow the sequential online softmax. Warpgroup
  1 first adopts the even block (waits for warpgroup 0's P and issues its PV), then waits for its own tile and
  issues its QK^T: its tile, the one released last in the previous pair, gets that long to fill. The price: no QK^T
  of warpgroup 1 runs under warpgroup 0's softmax any more. One P buffer: the other warpgroup loads each P before it
  publishes its own, and no wgmma reads it there, so an owner may overwrite it at once (no "P free" barrier, no
  proxy fence).
  An odd block count ends with warpgroup 0's block alone. The row sums stay per warpgroup and are added at the end.

Numerics are the Triton kernel's (and the reference's): blocks of 64 slots in order (window, then compressed), the
running max from -1e30 in the log2 domain, P rounded to bf16 before P.V, the sink in the denominator only, lse
without the sink. Empty slots (-1, or an id outside the cache) copy zeros, in every format: their score is -inf,
so P is exactly 0, and 0 x the zero row adds nothing, where 0 x a NaN or inf that some cache row held would make
the output NaN (until session 63 the bf16 rows' empty slots gathered row 0). A source with no rows is never routed
here.

Shared memory, one CTA per SM: Q 64 KB + 2 bf16 tiles 128 KB + P 8 KB + 1 KB of staged ids (+ 18 KB of raw
staging for quantized rows): 206,912 B with bf16 rows, 225,440 B paged (offline, triton 3.6, sm_90a).

Measured on H200 (docs/reports/flashmla-gluon.md): 1.30x the Triton kernel with bf16 rows, 1.66x with paged rows at
the prefill shape; a version whose consumers split the head dim instead of the slots was slower. Decode by CUDA-graph
replay at batch 64 / 128 / 256: 49.2 / 56.3 / 109.5 us against 82.2 / 95.7 / 181.6 (session 13 run 3). Session 23
(conflict-free dequantization, ids staged a block ahead): paged prefill 220 -> 254-255 TFLOP/s, decode 42-43 / 49-50
/ 96 us. Session 24 (the consumers in turns, in place of two warpgroups that split every block's slots and
exchanged the row max and P, so that the tensor pipe idled under every softmax): bf16 rows 1.08x, paged 1.03x,
decode 1.02x ("Session 24" in that report). Session 25 (the quantized producer's chunks staged LOOKAHEAD ahead, in
place of one buffer that held a whole block's gather before its conversion): paged 1.04x, decode 1.04-1.08x.
Session 26: split decode (each split walks its own blocks and writes partials, fp32 until session 62, that
sparse_attn_kernel.combine_splits_kernel merges), so that decode below one program per SM fills the SMs: 17.7 /
22.9 / 30.1 us at batch 8 / 32 / 64, about 1.6 / 1.9 / 1.3x the routes before ("Session 26" in that report).
Session 40 (warpgroup 1 adopts the even block before its QK^T, in place of the QK^T first, which waited ~28% of
warpgroup 1's time for its tile; bitwise the same outputs): paged prefill 1.029x, the prefill step's sparse
attention 46.47 -> 45.80 ms per 40 layers, bf16 rows 1.00x, decode 0.98-1.02x ("Session 40" in that report).
Session 55 (the window rows' e4m3 decoded by integer placement, in place of the e4m3 -> f16 -> bf16 conversions whose
F2F issues at a fifth of FFMA's rate; bitwise the same outputs): on an H100, paged prefill 1.050x, the step's sparse
attention stage 1.047x, decode 1.00-1.03x (H200: 1.037x). Session 56 (the FP4 rows' codes split once per word, 10 ALU
instructions per word in place of 13, and the window rows' shift as a multiply; bitwise the same outputs): on an H100,
paged prefill 1.067x, the step's sparse attention stage 1.030x, decode 1.01-1.03x. Session 57 (the producer's shared
loads of ids and staged words issued ahead of the chunk's copies, each used an iteration's work later, and the staging
ring in two allocations, one partition barrier per chunk instead of two; bitwise the same outputs): on an H100, paged
prefill 1.036x and 1.021x, the step's sparse attention stage 1.034x and 1.011x, decode 1.00-1.03x. Session 59 (the
outputs through shared memory in whole-row stores): paged prefill 1.119x. Session 62 (the split partials in bf16, in
place of fp32, through the same staging): split decode 1.13 / 1.14 / 1.16x at batch 8 / 32 / 64 on an H100, 1.08 /
1.11 / 1.12x on an H200.
api routes every call of whole 64-head programs here.
"""

from __future__ import annotations

from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

# One int32 word of e4m3 values (dims 4i .. 4i + 3 in bytes 0 .. 3) -> two bf16x2 words ($0: dims 4i, 4i + 1; $1: the
# next two) times $3, the group's scale as a bf16x2 pair, by integer placement, not the conversion instructions (the
# e4m3 -> f16 -> bf16 route issued one F2FP and two F2F per pair; docs/reports/flashmla-gluon.md, "Session 55"). Per
# pair, prmt puts each code in its half's low byte with its sign replicated over the byte above; a multiply by 16 leaves
# each code's magnitude (exponent and mantissa) in bf16 bits 4-10 and its sign in bit 15, which (the other bits cleared)
# reads as the e4m3 value x 2^-120, subnormal codes too; exact bf16x2 multiplies by 2^120 and the scale give the value.
# (ptxas issues part of the multiplies as IMAD.SHL, off the ALU pipe: the kernel ran 1.034x faster than with an
# arithmetic shift by 4, session 56.) A NaN code (magnitude 0x7F; pack_window_fp8 writes it for a NaN input) gets its
# half's other bits set instead of cleared, a bf16 NaN: n's byte j has bit 7 set for it, and prmt replicates that bit
# over the half (f); lop3 0xE4 takes the placed word under the mask and f elsewhere.
_FP8_WORD_PTX: gl.constexpr = gl.constexpr("""
{
.reg .b32 n, x, f, two120;
mov.b32 two120, 0x7B807B80;
and.b32 n, $2, 0x7F7F7F7F;
add.u32 n, n, 0x01010101;
""" + "".join(f"""prmt.b32 x, $2, $2, {place};
mul.lo.u32 x, x, 16;
prmt.b32 f, n, n, {nan};
lop3.b32 x, x, f, 0x87F087F0, 0xE4;
mul.rn.bf16x2 x, x, two120;
mul.rn.bf16x2 ${j}, x, $3;
""" for j, (place, nan) in enumerate([("0x9180", "0x9988"), ("0xB3A2", "0xBBAA")])) + "}\n")
# One int32 word of e2m1 pairs (byte j: dim 8i + 2j in its low nibble, 8i + 2j + 1 in its high one) -> four bf16x2 words
# in dim order ($0 .. $3) times $5, the group's scale as a bf16x2 pair. The word's codes are split once into the odd
# dims' (hi, a shift and a mask) and the even dims' (lo = w - 16 hi, a multiply-add on the FMA pipe), each in its bytes'
# low nibble: 10 ALU instructions per word where a mask per output word took 13 (paged rows 1.032x,
# docs/reports/flashmla-gluon.md, "Session 56"). Per output word, prmt puts lo's byte j in the low half and hi's in the
# high half, with zero bytes between (the sign of a byte below 0x80); the mul-and of gemm_swapab_kernel's
# _FP4_NIBBLE_PTX moves each nibble's magnitude to bits 6-8 and its sign to bit 15, which reads as code x 2^-126, and
# exact bf16x2 multiplies by 2^126 and the scale give the value.
_FP4_WORD_PTX: gl.constexpr = gl.constexpr("""
{
.reg .b32 lo, hi, t, two126;
mov.b32 two126, 0x7E807E80;
shr.b32 hi, $4, 4;
and.b32 hi, hi, 0x0F0F0F0F;
mad.lo.u32 lo, hi, 0xFFFFFFF0, $4;
""" + "".join(f"""prmt.b32 t, lo, hi, 0x8{4 + j}8{j};
mul.lo.u32 t, t, 0x1040; and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 t, t, two126; mul.rn.bf16x2 ${j}, t, $5;
""" for j in range(4)) + "}\n")

# Row formats (the values of sparse_attn_kernel's FORMAT_* constants) and their byte layouts (cache_layout.py).
BF16_ROWS: gl.constexpr = gl.constexpr(0)  # bf16 [n, 512]
FP8_WINDOW: gl.constexpr = gl.constexpr(1)  # 512 B e4m3, then 16 B UE8M0 (one per 32 dims)
FP4_COMPRESSED: gl.constexpr = gl.constexpr(2)  # 256 B e2m1 pairs (low nibble = even dim), then 32 B e4m3 (per 16)
WINDOW_ROW: gl.constexpr = gl.constexpr(528)
COMPRESSED_ROW: gl.constexpr = gl.constexpr(288)

BLOCK_N: gl.constexpr = gl.constexpr(64)  # slots per block: the reference's online-softmax step
HEADS: gl.constexpr = gl.constexpr(64)  # heads per CTA: the wgmma M side
D: gl.constexpr = gl.constexpr(512)
TILES: gl.constexpr = gl.constexpr(2)  # bf16 tiles in the ring: a consumer pair's two blocks, or one being filled
PRODUCER_WARPS: gl.constexpr = gl.constexpr(4)  # 8 would launch 16 warps at 128 registers: ptxas needs 158 (PV wgmma)
PRODUCER_REGS: gl.constexpr = gl.constexpr(80)
NEG_INIT: gl.constexpr = gl.constexpr(-1e30)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)

# Producer layouts (PRODUCER_WARPS warps). bf16 rows: cp.async, 16 B per copy.
BF16_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PRODUCER_WARPS, 1], [1, 0])  # [64, 512] bf16 rows
# Quantized rows, a chunk (_chunk_rows: 8 window or 16 compressed rows, 32 B of values per thread and row) at a
# time, as int32 words in these layouts: a thread holds whole scale groups (window: 8 words = 32 values, compressed:
# 2 words = 16 values), so a scale multiplies its group by a broadcast in registers; the 2-D loads reshape to these
# without data movement. A warp spans 8 rows and 4 threads along a row, rows fastest across lanes (order [0, 1]): a
# 16-byte access is served 8 lanes at a time, and those 8 lanes, at one place in 8 consecutive rows, write the 8
# units of one 128-byte line of the tile's 128 B swizzle (unit ^= row % 8) and read 8 different units of the
# swizzled staging buffer: conflict-free. Nsight Compute: [2 rows, 16 threads] put 8 threads of a row on 2 units, 4x
# the ideal store wavefronts (session 17: 69% of the kernel's shared-store wavefronts were conflicts); [8, 4] with
# the columns fastest, 2x (session 23 run 1).
WINDOW_WORDS: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [1, PRODUCER_WARPS], [0, 1])  # [8, 128] int32
# [8, 16, 8] window words (8 per scale group) and [16, 32, 2] compressed words (2 per scale group)
WINDOW_GROUPS: gl.constexpr = gl.BlockedLayout([1, 1, 8], [8, 4, 1], [1, PRODUCER_WARPS, 1], [0, 1, 2])
COMPRESSED_WORDS: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [1, PRODUCER_WARPS], [0, 1])  # [16, 64] int32
COMPRESSED_GROUPS: gl.constexpr = gl.BlockedLayout([1, 2, 2], [8, 4, 1], [1, PRODUCER_WARPS, 1], [0, 1, 2])
# a chunk's scales as the conversion reads them, [8 or 16 rows, 16]: a thread's group's UE8M0 byte (window, int8) or
# its pair of groups' e4m3 bytes (compressed, int16) per row
SCALE_WORDS: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [1, PRODUCER_WARPS], [0, 1])
# a chunk's scale bytes as copied, each row's once: [16, 8] int32 words (compressed, 32 B a row; a warp copies 4 rows,
# 8 lanes a row's contiguous 32 bytes) or [8, 4] (window, 16 B a row; the layout's other lanes and warps replicate)
SCALE_COPY: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
LOOKAHEAD: gl.constexpr = gl.constexpr(3)  # chunks whose copies are in flight while one is converted
STAGES: gl.constexpr = gl.constexpr(LOOKAHEAD + 1)  # staging buffers of 4 KB of values and 512 B of scales
STAGE_FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
# A chunk's values in 16-byte units swizzled by row (unit ^= row % 8): the 8 rows a warp reads at one place are
# conflict-free. A compressed chunk's scale rows (32 B) with their two 16-byte units swapped on rows 4-7 of every 8
# (unit ^= row // 4 % 2), so that 8 rows read at one column hit 8 different banks; the same bytes as int32 words (the
# copy) and as int16 pairs (the conversion). A window chunk's 16-byte scale rows are conflict-free unswizzled.
STAGE_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
SCALES_COPY_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=4, max_phase=2, order=[1, 0])
SCALES_READ_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=4, max_phase=2, order=[1, 0])
# Consumer layouts (two partitions of one warpgroup each): S = Q K^T of a whole block in one warpgroup, and each
# warpgroup's half of the output columns.
HALF: gl.constexpr = gl.constexpr(D // 2)  # output columns per consumer warpgroup
# Registers: every thread of the 12 warps starts with MAXNREG (64K per SM, a multiple of 8); the partitions then trade
# them (setmaxnreg): 2 x 128 x CONSUMER_REGS + 128 x PRODUCER_REGS = 65,536. 216 / 80: with P in registers for the
# PV (16 per thread) the consumers spilled 48 B at 208 / 96; the producer fits 80 without spills (offline, sm_90a).
CONSUMER_REGS: gl.constexpr = gl.constexpr(216)
MAXNREG: gl.constexpr = gl.constexpr(65536 // ((8 + PRODUCER_WARPS.value) * 32) // 8 * 8)
Q_HALF_COPY: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # [64, 256] bf16, one warpgroup
S_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
O_WG: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
# P as the PV wgmma's register operand: the owner's from its softmax, the other warpgroup's loaded from P's buffer
P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_WG, k_width=2)
STATS_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
TILE_SHARED: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
# A warpgroup's bf16 outputs [64, 256] leave through shared memory (tile 0, free once both warpgroups are done) in
# this layout, where a warp's store is 512 contiguous bytes of one row: from the MMA's layout each store instruction
# wrote 4 bytes in each of 8 rows, and the epilogue took ~9,000 of a program's ~57,000 cycles (session 59's trace).
OUT_BF16: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
# A block's 64 slot ids, staged ahead (bf16 rows: one block, quantized rows: two); every producer thread loads one of
# them (each id twice over the 128 threads). Four slots: while the consumers read blocks b - 1 and b, the producer
# reads block b + 1's (quantized rows) and may store block b + 2's, and only once the consumers released block b - 2
# (it waits for that block's tile before its first store into it).
IDS_SLOTS: gl.constexpr = gl.constexpr(4)
IDS_LOAD: gl.constexpr = gl.BlockedLayout([1], [32], [PRODUCER_WARPS], [0])
IDS_SHARED: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])


# The event trace (trace_ptr, int64 [programs, TRACE_ROLES, TRACE_EVENTS]; benchmarks/exp_flashmla_trace.py): per
# program, row 0 / 1 the consumer warpgroups' events, row 2 the producer's, row 3 the header (SM id, then the first
# and last clock of consumer warpgroup 0 and of the producer). Events of a consumer pair p start at p x PAIR_EVENTS,
# a producer's block b at b x 2; those past TRACE_EVENTS are dropped.
TRACE_ROLES: gl.constexpr = gl.constexpr(4)
TRACE_EVENTS: gl.constexpr = gl.constexpr(64)
PAIR_EVENTS: gl.constexpr = gl.constexpr(6)
HEADER: gl.constexpr = gl.constexpr(3)


@gluon.jit
def _mark(trace_ptr, role: gl.constexpr, event, value=None):
    """Without a trace buffer (trace_ptr None): nothing, compiled out. With one: this SM's clock (%clock64, or value)
    as event `event` of `role` in this program's row, read and stored by one thread of the partition (Triton stores
    a scalar from one thread), so a role's events follow that thread's program order."""
    if trace_ptr is not None:
        if value is None:
            value = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        program = (gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(2) + gl.program_id(2)
        gl.store(trace_ptr + (program * TRACE_ROLES + role) * TRACE_EVENTS + event, value, mask=event < TRACE_EVENTS)


@gluon.jit
def _mark_sm(trace_ptr):
    """The header's SM id (event 0 of row HEADER), with a trace buffer."""
    if trace_ptr is not None:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)
        _mark(trace_ptr, HEADER, 0, sm.to(gl.int64))


@gluon.jit
def _block_ids(blk, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len):
    """int32 [64] slot ids of logical block blk (source A's blocks, then source B's) in IDS_LOAD, -1 past the end of
    its list (or of the walk)."""
    in_a = blk < a_blocks
    ids_ptr = gl.where(in_a, a_ids_ptr, b_ids_ptr)
    pos = gl.where(in_a, blk, blk - a_blocks) * BLOCK_N + gl.arange(0, BLOCK_N, IDS_LOAD)
    return gl.load(ids_ptr + pos, mask=pos < gl.where(in_a, a_len, b_len), other=-1)


@gluon.jit
def _staged_rows(ids_slot, num_rows, layout: gl.constexpr):
    """int64 [64] cache rows of a block whose ids are in shared memory; -1 for an empty slot (-1, or an id outside
    the cache), whose copy is masked off (zeros)."""
    ids = ids_slot.load(layout)
    return gl.where((ids >= 0) & (ids < num_rows), ids, -1).to(gl.int64)


@gluon.constexpr_function
def _chunk_rows(FORMAT):
    """Rows of a quantized block's chunk: 32 B of values per thread and row (8 words over the producer's threads)."""
    return 8 if FORMAT == FP8_WINDOW else 16


@gluon.constexpr_function
def _chunk_words(FORMAT):
    """A chunk's values as int32 words per row, and their register layout."""
    return (128, WINDOW_WORDS) if FORMAT == FP8_WINDOW else (64, COMPRESSED_WORDS)


@gluon.jit
def _chunk_views(stage_words, stage_scales, k, FORMAT: gl.constexpr):
    """Staging buffer k (a compile-time index: buffer k // 2 of the even or odd allocation, _ring_buffers) as one
    chunk: values [R, words per row] int32, and its rows' scale bytes twice, as the copy writes them ([R, 4 or 8]
    int32) and as the conversion reads them ([R, 16]: a thread's byte (window, int8) or byte pair (compressed,
    int16))."""
    R: gl.constexpr = _chunk_rows(FORMAT)
    VALUES: gl.constexpr = _chunk_words(FORMAT)[0]
    scales = stage_scales[k % 2].index(k // 2)
    if FORMAT == FP8_WINDOW:
        copied = scales._reinterpret(gl.int32, [R, 4], STAGE_FLAT)
        read = scales._reinterpret(gl.int8, [R, 16], STAGE_FLAT)
    else:
        copied = scales._reinterpret(gl.int32, [R, 8], SCALES_COPY_SHARED)
        read = scales._reinterpret(gl.int16, [R, 16], SCALES_READ_SHARED)
    return stage_words[k % 2].index(k // 2)._reinterpret(gl.int32, [R, VALUES], STAGE_SHARED), copied, read


@gluon.jit
def _chunk_all_ids(ids_slot, first, FORMAT: gl.constexpr):
    """int32 [R] staged slot ids of one chunk of a quantized block (slots `first` on), twice: in the row layout of its
    value words, and in that of its scale copy."""
    chunk = ids_slot.slice(first, _chunk_rows(FORMAT))
    return chunk.load(gl.SliceLayout(1, _chunk_words(FORMAT)[1])), chunk.load(gl.SliceLayout(1, SCALE_COPY))


@gluon.jit
def _chunk_cache_rows(ids, num_rows, live):
    """The cache rows of a chunk's ids (_chunk_all_ids): -1 for an empty slot, an id outside the cache, or a chunk that
    is not `live`."""
    return gl.where(live & (ids >= 0) & (ids < num_rows), ids, -1)


@gluon.jit
def _chunk_issue(stage_words, stage_scales, k, kv_ptr, rows, scale_rows, FORMAT: gl.constexpr):
    """cp.async of one chunk of a quantized block (`rows`, `scale_rows`: _chunk_cache_rows of _chunk_all_ids) into
    staging buffer k, as int32 words: the values by the threads that convert them (32 B a thread), each row's scale
    bytes once (a word a thread: compressed rows' 32 B, window rows' 16 B); one commit group. Each thread copied the
    scale word its groups need until session 67: every word twice (compressed) or four times (window), half of a
    compressed chunk's copy instructions, and together 4% of a paged block (exp_flashmla_gluon_breakdown.py, H200);
    copied once, paged prefill 1.02-1.03x (H100, flashmla-gluon.md "Session 67"). Rows -1 copy zeros (finite; their
    score is -inf)."""
    ROW: gl.constexpr = (WINDOW_ROW if FORMAT == FP8_WINDOW else COMPRESSED_ROW) // 4  # in words
    VALUES: gl.constexpr = _chunk_words(FORMAT)[0]
    WORDS: gl.constexpr = _chunk_words(FORMAT)[1]
    values, scales, _ = _chunk_views(stage_words, stage_scales, k, FORMAT)
    SCALES: gl.constexpr = scales.type.shape[1]  # scale words per row
    kv_words = kv_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    cols = gl.arange(0, VALUES, gl.SliceLayout(0, WORDS))
    async_copy.async_copy_global_to_shared(values, kv_words + rows.to(gl.int64)[:, None] * ROW + cols[None, :],
                                           mask=(rows >= 0)[:, None])
    col = VALUES + gl.arange(0, SCALES, gl.SliceLayout(0, SCALE_COPY))
    async_copy.async_copy_global_to_shared(scales, kv_words + scale_rows.to(gl.int64)[:, None] * ROW + col[None, :],
                                           mask=(scale_rows >= 0)[:, None])
    async_copy.commit_group()


@gluon.jit
def _bf16_halves(words):
    """bf16 [..., 2] of int32 words holding bf16x2 pairs (the low half first)."""
    return gl.join(words.to(gl.int16).to(gl.bfloat16, bitcast=True),
                   (words >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True))


@gluon.jit
def _e4m3_bf16_bits(byte):
    """int32 bf16 bits of e4m3 codes held in the low byte of int32 values (exact)."""
    code = byte.to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    return code.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF


@gluon.jit
def _dequant_chunk(words, scales, tile_rows, FORMAT: gl.constexpr):
    """One chunk's words (int32) and scale bytes (_chunk_views' read view) -> bf16 into `tile_rows` (the chunk's rows of
    a tile), equal to cache_layout's unpack functions bit for bit: a word's values times their scale (every value has
    at most 6 significant bits and the scales are powers of two or e4m3: the bf16 multiply is exact)."""
    R: gl.constexpr = _chunk_rows(FORMAT)
    if FORMAT == FP8_WINDOW:
        e = scales.to(gl.int32) & 0xFF
        pair = gl.convert_layout((e << 7) * 0x10001, gl.SliceLayout(2, WINDOW_GROUPS), assert_trivial=True)
        w = gl.convert_layout(gl.reshape(words, [R, 16, 8]), WINDOW_GROUPS, assert_trivial=True)
        pair, w = gl.broadcast(pair[:, :, None], w)  # UE8M0 -> 2^(e-127): bf16's exponent field, in both halves
        lo, hi = gl.inline_asm_elementwise(_FP8_WORD_PTX, "=r,=r,r,r", [w, pair], dtype=(gl.int32, gl.int32),
                                           is_pure=True, pack=1)
        tile_rows.store(gl.reshape(_bf16_halves(gl.join(lo, hi)), [R, D]))
    else:
        two = scales.to(gl.int32)  # the thread's two groups' e4m3 scales in bits 0-15
        bits = gl.reshape(gl.join(_e4m3_bf16_bits(two), _e4m3_bf16_bits(two >> 8)), [R, 32])
        pair = gl.convert_layout(bits * 0x10001, gl.SliceLayout(2, COMPRESSED_GROUPS), assert_trivial=True)
        w = gl.convert_layout(gl.reshape(words, [R, 32, 2]), COMPRESSED_GROUPS, assert_trivial=True)
        pair, w = gl.broadcast(pair[:, :, None], w)
        d01, d23, d45, d67 = gl.inline_asm_elementwise(_FP4_WORD_PTX, "=r,=r,=r,=r,r,r", [w, pair],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        halves = _bf16_halves(gl.join(gl.join(d01, d45), gl.join(d23, d67)))  # [..., i, j, h]: word 2i + j, half h
        tile_rows.store(gl.reshape(halves, [R, D]))


@gluon.jit
def _quantized_source(tiles, stage_words, stage_scales, ids_smem, full, empty, blk0, blk_end, kv_ptr, num_rows,
                      a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len, trace_ptr, FORMAT: gl.constexpr):
    """Blocks blk0 .. blk_end - 1 (one source, all in FORMAT) into the tile ring, chunk by chunk: the cp.async of the
    chunk LOOKAHEAD ahead (also across a block boundary) is issued once a chunk's words are loaded and before they
    are converted, so that it lands under that many chunks' conversion; a ring of LOOKAHEAD + 1 staging buffers
    (chunk c in buffer c % 4, since a block has 4 or 8 chunks). A block's ids are stored two blocks ahead (the
    copies of block blk + 1 start during block blk), loaded from global memory at its first chunk and stored after
    its last."""
    R: gl.constexpr = _chunk_rows(FORMAT)
    CHUNKS: gl.constexpr = BLOCK_N // R
    gl.static_assert(CHUNKS % STAGES == 0 and CHUNKS >= LOOKAHEAD)
    live = blk0 < blk_end
    ids, scale_ids = _chunk_all_ids(ids_smem.index(blk0 % IDS_SLOTS), 0, FORMAT)
    rows, scale_rows = _chunk_cache_rows(ids, num_rows, live), _chunk_cache_rows(scale_ids, num_rows, live)
    for c in gl.static_range(LOOKAHEAD):
        _chunk_issue(stage_words, stage_scales, c, kv_ptr, rows, scale_rows, FORMAT)
        ids, scale_ids = _chunk_all_ids(ids_smem.index(blk0 % IDS_SLOTS), (c + 1) * R, FORMAT)
        rows, scale_rows = _chunk_cache_rows(ids, num_rows, live), _chunk_cache_rows(scale_ids, num_rows, live)
    for blk in range(blk0, blk_end):
        t = blk % TILES
        ids_ahead = _block_ids(blk + 2, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len)  # stored after this block
        for c in gl.static_range(CHUNKS):
            # Loads first, each used an iteration's work later (H100 profile, session 57: the ids, loaded behind the
            # copies and used at once, and the words, used at once after the wait, held ~20% of the producer's stall
            # samples on compressed blocks): the ids of chunk c + LOOKAHEAD + 1 (its rows at the end), chunk c's
            # words, and only then chunk c + LOOKAHEAD's copies (rows of the previous iteration), under whose issue
            # the words arrive. Paged prefill 1.036x (flashmla-gluon.md, "Session 57").
            ahead = blk + (c + LOOKAHEAD + 1) // CHUNKS
            ids_next, scale_ids_next = _chunk_all_ids(ids_smem.index(ahead % IDS_SLOTS),
                                                      (c + LOOKAHEAD + 1) % CHUNKS * R, FORMAT)
            async_copy.wait_group(LOOKAHEAD - 1)  # this thread's copies of chunk c have landed
            staged_words, _, staged_scales = _chunk_views(stage_words, stage_scales, c % STAGES, FORMAT)
            words = staged_words.load(_chunk_words(FORMAT)[1])
            scales = staged_scales.load(SCALE_WORDS)
            _chunk_issue(stage_words, stage_scales, (c + LOOKAHEAD) % STAGES, kv_ptr, rows, scale_rows, FORMAT)
            if c == 0:
                mbarrier.wait(empty.index(t), ((blk // TILES) & 1) ^ 1)
                _mark(trace_ptr, 2, 2 * blk)
            _dequant_chunk(words, scales, tiles.index(t).slice(c * R, R, dim=0), FORMAT)
            rows = _chunk_cache_rows(ids_next, num_rows, ahead < blk_end)
            scale_rows = _chunk_cache_rows(scale_ids_next, num_rows, ahead < blk_end)
        ids_smem.index((blk + 2) % IDS_SLOTS).store(ids_ahead)
        # One arrival (full's count), after the partition barrier Gluon puts before a single-thread operation:
        # every producer thread's tile and ids stores are ordered before it, so before the consumers' reads, and
        # before this partition's own chunk copies of block blk + 2
        mbarrier.arrive(full.index(t), count=1)
        _mark(trace_ptr, 2, 2 * blk + 1)
    async_copy.wait_group(0)  # the copies past the end (masked, zeros) before the next source reuses the buffers


@gluon.jit
def _producer(tiles, stage_words, stage_scales, ids_smem, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr,
              a_len, a_rows, b_kv_ptr, b_ids_ptr, b_len, b_rows, trace_ptr, A_FORMAT: gl.constexpr,
              B_FORMAT: gl.constexpr):
    """Worker partition: every block, in order, into tile blk % 2 once the consumers have released it (the first lap
    waits on the barriers' initial phase, which counts as complete). Block ids go from global memory into ids_smem
    (slot blk % IDS_SLOTS) ahead of their block, where the gathers and the consumers' masks read them: their latency
    is not in front of the gather (Nsight Compute, session 17: ~23% of the quantized producer's stall samples waited
    on the ids) nor in the consumers' loop. bf16 rows: one block ahead, stored before the producer's arrival on the
    previous block's "full" barrier; quantized rows: two blocks ahead (_quantized_source). Trace events per block b:
    2b its tile free (the wait on empty done), 2b + 1 its tile handed over (bf16 rows: its copies issued)."""
    _mark(trace_ptr, HEADER, 3)
    if A_FORMAT == BF16_ROWS:
        ids_smem.index(0).store(_block_ids(0, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len))
        gl.thread_barrier()
        for blk in range(n_blocks):
            t = blk % TILES
            next_ids = _block_ids(blk + 1, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len)  # stored after this block
            ids_slot = ids_smem.index(blk % IDS_SLOTS)
            rows = _staged_rows(ids_slot, a_rows, gl.SliceLayout(1, BF16_COPY))
            cols = gl.arange(0, D, gl.SliceLayout(0, BF16_COPY))
            mbarrier.wait(empty.index(t), ((blk // TILES) & 1) ^ 1)
            _mark(trace_ptr, 2, 2 * blk)
            # an empty slot's row copies zeros: its P is 0, and 0 x a NaN or inf in some cache row would be NaN
            async_copy.async_copy_global_to_shared(tiles.index(t), a_kv_ptr + rows[:, None] * D + cols[None, :],
                                                   mask=(rows >= 0)[:, None])
            # each producer thread's arrive fires when its copies have landed (PRODUCER_WARPS x 32 of full's count)
            async_copy.mbarrier_arrive(full.index(t), increment_count=False)
            ids_smem.index((blk + 1) % IDS_SLOTS).store(next_ids)
            # One arrival (the last of full's count), after the partition barrier Gluon puts before a single-thread
            # operation: every producer thread's ids store is ordered before it, so before the consumers' reads.
            mbarrier.arrive(full.index(t), count=1)
            _mark(trace_ptr, 2, 2 * blk + 1)
    else:
        for blk in gl.static_range(2):
            ids_smem.index(blk).store(_block_ids(blk, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len))
        gl.thread_barrier()
        _quantized_source(tiles, stage_words, stage_scales, ids_smem, full, empty, 0, a_blocks, a_kv_ptr, a_rows,
                          a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len, trace_ptr, A_FORMAT)
        _quantized_source(tiles, stage_words, stage_scales, ids_smem, full, empty, a_blocks, n_blocks, b_kv_ptr,
                          b_rows, a_blocks, a_ids_ptr, a_len, b_ids_ptr, b_len, trace_ptr, B_FORMAT)
    _mark(trace_ptr, HEADER, 4)


@gluon.jit
def _qk(q, tile, zero):
    """S = Q K^T of one block (Q [64, 512], the tile [64, 512], both in shared memory), issued, not waited for."""
    return warpgroup_mma(q, tile.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _pv(p, tile_half, acc):
    """acc += P V on this warpgroup's 256 output columns (P bf16 [64, 64] in registers, P_OP; the tile's half in shared
    memory), issued, not waited for."""
    return warpgroup_mma(p, tile_half, acc, is_async=True)


@gluon.jit
def _own_softmax(s, ids_slot, num_rows, qk_scale_log2, m_run, l_own):
    """The owner's online-softmax step on its block (s: the finished QK^T accumulator; -inf on empty slots) ->
    (running max, alpha, P in fp32, row sum of the owner's blocks)."""
    ids = ids_slot.load(gl.SliceLayout(0, S_WG))  # -1 past the list's end
    valid = (ids >= 0) & (ids < num_rows)  # anything outside the cache is empty, like -1
    s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = gl.maximum(m_run, gl.max(s, 1))
    alpha = gl.exp2(m_run - m_new)
    p = gl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_own * alpha + gl.sum(p, 1)


@gluon.jit
def _publish(p, m_new, p_smem, m_smem, pub_bar):
    """The owner's P (rounded to bf16 before P.V, as the reference) and running max of its block; then one arrival on
    pub_bar (after Gluon's partition barrier: every thread has stored) -> P as the owner's own PV operand (P_OP). Both
    buffers are free: the other warpgroup loaded the previous P into registers before it published (program order),
    and no wgmma reads P from shared memory, so no proxy fence and no "P free" barrier."""
    p16 = p.to(gl.bfloat16)
    p_smem.store(p16)
    m_smem.store(m_new)
    mbarrier.arrive(pub_bar, count=1)
    return gl.convert_layout(p16, P_OP, assert_trivial=True)  # the accumulator's registers are the operand's


@gluon.jit
def _rescale(acc, alpha):
    return acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_WG), assert_trivial=True)[:, None]


@gluon.jit
def _adopt(p_smem, m_smem, m_run, l_own, acc, full_bar, pub_bar, phase):
    """The other warpgroup's block: once its tile and its P and max are in, rescale this warpgroup's row sum and
    accumulator to the new running max -> (running max, row sum, accumulator, its P in registers). The tile's proxy
    fence comes between the two waits: the tile is in long before the other warpgroup's P (its owner's QK^T and
    softmax ran on it), so the fence (MEMBAR.ALL.CTA and FENCE.VIEW.ASYNC in the SASS) runs while this warpgroup
    waits for P anyway, not in the chain after it. P needs none: it is read by ldmatrix, the generic proxy, after the
    owner's release."""
    mbarrier.wait(full_bar, phase)
    fence_async_shared()  # the tile's writes (cp.async or the producer's stores) before this warpgroup's wgmma reads
    mbarrier.wait(pub_bar, phase)
    p = p_smem.load(P_OP)  # ldmatrix: this warpgroup's copy of the other's P, read before it publishes its own
    m_new = m_smem.load(gl.SliceLayout(1, S_WG))
    alpha = gl.exp2(m_run - m_new)
    return m_new, l_own * alpha, _rescale(acc, alpha), p


@gluon.jit
def _lead_block(q, tile, ids_slot, num_rows, qk_scale_log2, m_run, l_own, acc, zero_s, p_smem, m_smem, full_bar,
                phase, pub_bar, empty_bar, trace_ptr, ev):
    """Warpgroup 0's own block (even blocks): QK^T, softmax, publish, PV on columns 0-255 with P in registers,
    release -> (running max, row sum, accumulator). Trace events ev + 0..3: tile in, QK^T done, softmax done, PV
    done."""
    mbarrier.wait(full_bar, phase)
    _mark(trace_ptr, 0, ev)
    fence_async_shared()  # Q's and the bf16 rows' cp.async (generic-proxy) writes before wgmma's reads
    s = warpgroup_mma_wait(0, deps=[_qk(q, tile, zero_s)])
    _mark(trace_ptr, 0, ev + 1)
    m_run, alpha, p, l_own = _own_softmax(s, ids_slot, num_rows, qk_scale_log2, m_run, l_own)
    _mark(trace_ptr, 0, ev + 2)
    p = _publish(p, m_run, p_smem, m_smem, pub_bar)
    acc = warpgroup_mma_wait(0, deps=[_pv(p, tile.slice(0, HALF, dim=1), _rescale(acc, alpha))])
    _mark(trace_ptr, 0, ev + 3)
    mbarrier.arrive(empty_bar, count=1)
    return m_run, l_own, acc


@gluon.jit
def _store_out(tiles, acc, denom, dst_ptr, row, stride_row, stride_h, head0, WG: gl.constexpr):
    """acc / denom (0 where denom is 0) as bf16 into this warpgroup's 256 columns of the [64 heads, 512] rows at
    dst_ptr + row * stride_row (a 64-bit product: it passes 2**31 from s_q = 65,536 at 64 heads; head rows stride_h
    apart), through its columns of tile 0 (free: both warpgroups are past their last PV): 16-byte stores, where the
    MMA's layout holds 4 bytes per thread and row (straight from it, the unsplit outputs were 0.89x in session 59,
    the split partials 0.83-0.95x in session 62)."""
    denom = gl.convert_layout(denom, gl.SliceLayout(1, O_WG), assert_trivial=True)
    o = gl.where(denom[:, None] > 0, acc / denom[:, None], 0.0).to(gl.bfloat16)
    staging = tiles.index(0).slice(WG * HALF, HALF, dim=1)
    staging.store(o)
    o = staging.load(OUT_BF16)
    out_heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, OUT_BF16))
    out_dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, OUT_BF16))
    gl.store(dst_ptr + row.to(gl.int64) * stride_row + out_heads[:, None] * stride_h + out_dims[None, :], o)


@gluon.jit
def _consumer(q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, both, q_ptr, stride_q_s,
              stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr,
              stride_lse_s, part_out_ptr, part_lse_ptr, qk_scale_log2, trace_ptr, HAS_SINK: gl.constexpr,
              SPLIT: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG (0: the default partition, 1: a worker): the softmax of blocks WG, WG + 2, ..., PV of
    every block on output columns WG * 256 .. WG * 256 + 255; writes those columns of out and (WG 0) lse. Trace
    events per pair (from pair x PAIR_EVENTS): warpgroup 0 _lead_block's four, then block b adopted, its PV done;
    warpgroup 1 block a adopted, tile b in, PV a and QK^T b done, softmax done, PV b done."""
    if WG == 0:
        _mark_sm(trace_ptr)
        _mark(trace_ptr, HEADER, 1)
    sq = gl.program_id(0)
    head0 = gl.program_id(1) * HEADS
    heads = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, Q_HALF_COPY))
    dims = WG * HALF + gl.arange(0, HALF, gl.SliceLayout(0, Q_HALF_COPY))
    async_copy.async_copy_global_to_shared(q_smem.index(0).slice(WG * HALF, HALF, dim=1),
                                           q_ptr + sq.to(gl.int64) * stride_q_s + heads[:, None] * stride_q_h
                                           + dims[None, :])  # 64-bit: sq * stride_q_s passes 2**31 at s_q 65,536
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()  # this half of Q (cp.async, generic proxy) before either warpgroup's wgmma reads it
    mbarrier.arrive(both, count=1)  # after the partition barrier: this warpgroup's half of Q has landed
    mbarrier.wait(both, 0)

    m_run = gl.full([HEADS], NEG_INIT, gl.float32, gl.SliceLayout(1, S_WG))
    l_own = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_WG))
    acc = gl.full([HEADS, HALF], 0.0, gl.float32, O_WG)
    zero_s = gl.full([HEADS, BLOCK_N], 0.0, gl.float32, S_WG)
    n_pairs = n_blocks // 2
    for pair in range(n_pairs):
        blk_a = 2 * pair
        phase = pair & 1
        # Q and the tiles at indices the compiler cannot prove constant (a_rows >= 0 at run time, so flip is 0):
        # with constant ones the QK^T's 32 pairs of shared-memory descriptors are loop-invariant, hoisted and, in
        # warpgroup 0, spilled (offline: 536 bytes of stack, LDL.64 between its QK^T MMAs; none this way). The
        # comparison cannot overflow, where pair x a_rows < 0 did from 2^31 (e.g. 8,192 slots over 34M bf16 rows).
        flip = (pair < -a_rows).to(gl.int32)
        tile_a = tiles.index(flip)
        tile_b = tiles.index(1 - flip)
        ev = pair * PAIR_EVENTS
        if WG == 0:
            m_run, l_own, acc = _lead_block(q_smem.index(flip), tile_a, ids_smem.index(blk_a % IDS_SLOTS),
                                            gl.where(blk_a < a_blocks, a_rows, b_rows), qk_scale_log2, m_run, l_own,
                                            acc, zero_s, p_smem, m_smem, full.index(0), phase, pub.index(0),
                                            empty.index(0), trace_ptr, ev)
            # block b: warpgroup 1's P and max
            m_run, l_own, acc, p = _adopt(p_smem, m_smem, m_run, l_own, acc, full.index(1), pub.index(1), phase)
            _mark(trace_ptr, 0, ev + 4)
            acc = warpgroup_mma_wait(0, deps=[_pv(p, tile_b.slice(0, HALF, dim=1), acc)])
            _mark(trace_ptr, 0, ev + 5)
            mbarrier.arrive(empty.index(1), count=1)
        else:
            # block a first: warpgroup 0's P and max, and this warpgroup's PV on it; then block b's QK^T, whose tile
            # (released last in the previous pair) gets that long to fill
            m_run, l_own, acc, p = _adopt(p_smem, m_smem, m_run, l_own, acc, full.index(0), pub.index(0), phase)
            _mark(trace_ptr, 1, ev)
            acc_token = _pv(p, tile_a.slice(HALF, HALF, dim=1), acc)
            mbarrier.wait(full.index(1), phase)
            _mark(trace_ptr, 1, ev + 1)
            fence_async_shared()
            s_token = _qk(q_smem.index(flip), tile_b, zero_s)
            acc, s = warpgroup_mma_wait(0, deps=[acc_token, s_token])
            _mark(trace_ptr, 1, ev + 2)
            mbarrier.arrive(empty.index(0), count=1)
            m_run, alpha, p, l_own = _own_softmax(s, ids_smem.index((blk_a + 1) % IDS_SLOTS),
                                                  gl.where(blk_a + 1 < a_blocks, a_rows, b_rows), qk_scale_log2,
                                                  m_run, l_own)
            _mark(trace_ptr, 1, ev + 3)
            p = _publish(p, m_run, p_smem, m_smem, pub.index(1))
            acc = warpgroup_mma_wait(0, deps=[_pv(p, tile_b.slice(HALF, HALF, dim=1), _rescale(acc, alpha))])
            _mark(trace_ptr, 1, ev + 4)
            mbarrier.arrive(empty.index(1), count=1)
    if n_blocks % 2 == 1:  # the last block alone: warpgroup 0 owns it, warpgroup 1 adopts it
        blk = n_blocks - 1
        phase = n_pairs & 1
        if WG == 0:
            m_run, l_own, acc = _lead_block(q_smem.index(0), tiles.index(0), ids_smem.index(blk % IDS_SLOTS),
                                            gl.where(blk < a_blocks, a_rows, b_rows), qk_scale_log2, m_run, l_own,
                                            acc, zero_s, p_smem, m_smem, full.index(0), phase, pub.index(0),
                                            empty.index(0), trace_ptr, n_pairs * PAIR_EVENTS)
        else:
            m_run, l_own, acc, p = _adopt(p_smem, m_smem, m_run, l_own, acc, full.index(0), pub.index(0), phase)
            _mark(trace_ptr, 1, n_pairs * PAIR_EVENTS)
            acc = warpgroup_mma_wait(0, deps=[_pv(p, tiles.index(0).slice(HALF, HALF, dim=1), acc)])
            _mark(trace_ptr, 1, n_pairs * PAIR_EVENTS + 4)
            mbarrier.arrive(empty.index(0), count=1)

    # the row sums: each warpgroup's own blocks, at the same final max; added in one order in both
    l_smem.index(WG).store(l_own)
    mbarrier.arrive(both, count=1)  # the rendezvous's second phase: both warpgroups' sums are stored
    mbarrier.wait(both, 1)
    l_i = l_smem.index(0).load(gl.SliceLayout(1, S_WG)) + l_smem.index(1).load(gl.SliceLayout(1, S_WG))
    rows = head0 + gl.arange(0, HEADS, gl.SliceLayout(1, S_WG))
    lse = gl.where(l_i > 0, (m_run + gl.log2(l_i)) * LN2, float("-inf"))
    if SPLIT:  # this split's output over its own row sum, and its lse; the combine applies the sink
        part = sq * gl.num_programs(2) + gl.program_id(2)
        heads_all = gl.num_programs(1) * HEADS
        if WG == 0:
            gl.store(part_lse_ptr + part * heads_all + rows, lse)
        _store_out(tiles, acc, l_i, part_out_ptr, part, heads_all * D, D, head0, WG)
    else:
        denom = l_i
        if HAS_SINK:
            denom = denom + gl.exp2(gl.load(sink_ptr + rows) * LOG2E - m_run)  # sink in the denominator only
        if WG == 0:
            gl.store(lse_ptr + sq * stride_lse_s + rows, lse)
        _store_out(tiles, acc, denom, out_ptr, sq, stride_out_s, stride_out_h, head0, WG)
    if WG == 0:
        _mark(trace_ptr, HEADER, 2)


@gluon.jit
def _ring_buffers(A_FORMAT: gl.constexpr):
    """The shared memory the producer fills and the consumers release: the ring of bf16 tiles, the quantized rows'
    ring of STAGES staging buffers (bf16 rows: none, the tiles stand in), the ring of staged slot ids, and per tile
    a "full" mbarrier (the producer's one arrival, plus for bf16 rows one cp.async arrival per producer thread) and
    an "empty" one (one arrival per consumer warpgroup).
    The staging ring is two allocations, (even buffers, odd buffers) of words and of scales: a chunk loads buffer
    c % 4 and then copies into (c + 3) % 4, of the other parity. Gluon's barrier analysis tracks hazards per
    allocation, so in one allocation it put a partition barrier between those loads and copies, a second one per
    chunk beside the one after the copies' wait, which already orders every earlier load of the buffer being
    refilled (paged prefill 1.021x on an H100, flashmla-gluon.md, "Session 57")."""
    tiles = gl.allocate_shared_memory(gl.bfloat16, [TILES, BLOCK_N, D], TILE_SHARED)
    if A_FORMAT == BF16_ROWS:
        stage_words = (tiles, tiles)  # unused
        stage_scales = (tiles, tiles)
    else:
        gl.static_assert(LOOKAHEAD % 2 == 1 and STAGES % 2 == 0)  # chunk c and c + LOOKAHEAD of opposite parity
        stage_words = (gl.allocate_shared_memory(gl.int32, [STAGES // 2, 16, 64], STAGE_FLAT),
                       gl.allocate_shared_memory(gl.int32, [STAGES // 2, 16, 64], STAGE_FLAT))
        stage_scales = (gl.allocate_shared_memory(gl.int32, [STAGES // 2, 16, 8], STAGE_FLAT),
                        gl.allocate_shared_memory(gl.int32, [STAGES // 2, 16, 8], STAGE_FLAT))
    ids_smem = gl.allocate_shared_memory(gl.int32, [IDS_SLOTS, BLOCK_N], IDS_SHARED)
    full = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [TILES, 1], mbarrier.MBarrierLayout())
    for t in gl.static_range(TILES):
        mbarrier.init(full.index(t), count=PRODUCER_WARPS * 32 + 1 if A_FORMAT == BF16_ROWS else 1)
        mbarrier.init(empty.index(t), count=2)
    return tiles, stage_words, stage_scales, ids_smem, full, empty


@gluon.jit
def _query_blocks(a_ids_ptr, stride_a_ids, a_len, b_ids_ptr, stride_b_ids, b_len, blocks_per_split,
                  HAS_B: gl.constexpr):
    """This program's part of its query's walk (query program_id(0), split program_id(2): logical blocks
    split x blocks_per_split on, at most blocks_per_split of them, source A's before source B's) as a walk of its own:
    (its first ids of both lists, the lists' lengths from there, its source-A blocks, all its blocks). Every split has
    at least one block (the host's split count); a length can go negative past the list's end (its ids then read as
    empty)."""
    sq = gl.program_id(0)
    a_blocks = gl.cdiv(a_len, BLOCK_N)
    n_blocks = a_blocks
    if HAS_B:
        n_blocks += gl.cdiv(b_len, BLOCK_N)
    first = gl.program_id(2) * blocks_per_split
    n_local = gl.minimum(n_blocks - first, blocks_per_split)
    b_skip = gl.maximum(first - a_blocks, 0)
    return (a_ids_ptr + sq * stride_a_ids + first * BLOCK_N, a_len - first * BLOCK_N,
            b_ids_ptr + sq * stride_b_ids + b_skip * BLOCK_N, b_len - b_skip * BLOCK_N,
            gl.minimum(gl.maximum(a_blocks - first, 0), n_local), n_local)


# a_len / b_len = 1 specialised as a constant crashes triton 3.6's LLVM lowering (an assertion in
# ConvertTritonGPUToLLVM, seen on H200 with one window slot): the lengths and row counts stay runtime values.
@gluon.jit(do_not_specialize=["a_len", "a_rows", "b_len", "b_rows", "blocks_per_split"])
def sparse_mla_fwd_gluon_kernel(
    q_ptr, stride_q_s, stride_q_h,
    a_kv_ptr, a_ids_ptr, stride_a_ids, a_len, a_rows,
    b_kv_ptr, b_ids_ptr, stride_b_ids, b_len, b_rows,
    sink_ptr, out_ptr, stride_out_s, stride_out_h, lse_ptr, stride_lse_s,
    part_out_ptr, part_lse_ptr, blocks_per_split,
    qk_scale_log2, trace_ptr,
    A_FORMAT: gl.constexpr, B_FORMAT: gl.constexpr, HAS_B: gl.constexpr, HAS_SINK: gl.constexpr,
    SPLIT: gl.constexpr,
):
    """Grid (s_q, h // 64, num_splits), num_warps 4 (consumer warpgroup 0; warpgroup 1 and the producer's 4 warps
    come on top). Source A's blocks, then source B's (if HAS_B; bf16 rows come alone), blocks_per_split of them per
    split (the last split may have fewer, none has none). Unsplit, writes out bf16 [s_q, h, 512] and lse fp32 [s_q,
    h] (natural log, without the sink; -inf for a row with no valid slot). With SPLIT, writes each split's output
    normalised by its own row sum (bf16, 0 where it has none) to part_out [s_q, num_splits, h, 512] and its lse to
    part_lse [s_q, num_splits, h], which sparse_attn_kernel.combine_splits_kernel merges (and applies the sink to).
    trace_ptr: None, or int64 [programs, TRACE_ROLES, TRACE_EVENTS] for the event trace (_mark)."""
    a_ids_ptr, a_len, b_ids_ptr, b_len, a_blocks, n_blocks = _query_blocks(
        a_ids_ptr, stride_a_ids, a_len, b_ids_ptr, stride_b_ids, b_len, blocks_per_split, HAS_B)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [1, HEADS, D], TILE_SHARED)  # indexed by flip (see the loop)
    tiles, stage_words, stage_scales, ids_smem, full, empty = _ring_buffers(A_FORMAT)
    # One P and one max, taken in turns: two of each would put the paged path over the 227 KB an SM gives a CTA.
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, BLOCK_N], TILE_SHARED)
    m_smem = gl.allocate_shared_memory(gl.float32, [HEADS], STATS_SHARED)
    l_smem = gl.allocate_shared_memory(gl.float32, [2, HEADS], STATS_SHARED)
    # pub.index(w): warpgroup w has published its block's P and max (the other warpgroup's load of the previous P
    # is ordered before its own next publish by program order); both: the consumers' rendezvous (phase 0: Q loaded,
    # phase 1: row sums stored)
    pub = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    both = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(pub.index(w), count=1)
    mbarrier.init(both, count=2)
    gl.warp_specialize(
        [(_consumer, (q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, both, q_ptr, stride_q_s,
                      stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h,
                      lse_ptr, stride_lse_s, part_out_ptr, part_lse_ptr, qk_scale_log2, trace_ptr, HAS_SINK, SPLIT, 0)),
         (_consumer, (q_smem, tiles, ids_smem, p_smem, m_smem, l_smem, full, empty, pub, both, q_ptr, stride_q_s,
                      stride_q_h, n_blocks, a_blocks, a_rows, b_rows, sink_ptr, out_ptr, stride_out_s, stride_out_h,
                      lse_ptr, stride_lse_s, part_out_ptr, part_lse_ptr, qk_scale_log2, trace_ptr, HAS_SINK, SPLIT, 1)),
         (_producer, (tiles, stage_words, stage_scales, ids_smem, full, empty, n_blocks, a_blocks, a_kv_ptr, a_ids_ptr,
                      a_len, a_rows, b_kv_ptr, b_ids_ptr, b_len, b_rows, trace_ptr, A_FORMAT, B_FORMAT))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    _invalidate_ring(full, empty)
