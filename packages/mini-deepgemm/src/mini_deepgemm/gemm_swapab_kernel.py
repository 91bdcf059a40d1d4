"""Triton kernels of the UE8M0 (V4.1) GEMMs for many rows: the weights dequantized in registers, bf16 MMAs.

Why: with a scale per 32 of K on both operands, Hopper's FP8 MMA needs its result promoted into the fp32
accumulator every 32 of K (two CUDA-core ops per accumulator element per step: as many cycles as the MMA
itself, docs/reports/deepgemm-scaling.md). Dequantizing the operands instead costs work per operand element,
not per output element: a tile of 128 weight rows x 128 tokens dequantizes 128 x 32 weight values per 32 of K
for 128 x 128 x 32 MACs.

How (swap A and B): the kernel computes the transposed tile D^T[n, m] = W[n, :] . X[m, :].
- W (the weights, FP8 e4m3 with a UE8M0 scale per 32x32 block, or packed FP4 e2m1 with one per row per 32 of
  K) is the MMA's left operand, which Hopper's wgmma may read from registers. The intent was that each thread
  dequantizes its own fragment after the shared-memory load; triton 3.6 instead converts in a blocked layout and
  passes the bf16 tile through shared memory once more (seen in the TTGIR, docs/reports/deepgemm-fp4-ptx.md).
- X (the activations) is the right operand, read by the MMA from shared memory, so it must already be bf16:
  `dequant_act_kernel` turns the FP8 activations and their UE8M0 scales into bf16 once per call (exact:
  q * 2^e of an e4m3 value has 4 significant bits; in the contiguous layout only the real rows). For FP4
  weights it also permutes K inside each 64-wide block to [32 even columns | 32 odd columns], matching the two
  nibbles of a weight byte (low = even k), so a byte's two values feed two MMAs without interleaving registers.
- Few tokens per tile (decode: the masked layout, dense GEMMs of a few rows; X_FP8) skip that pass: the kernel
  dequantizes its [tokens, 64] activation tile itself (for FP4 weights splitting it into even and odd columns in
  registers). The tile is BLOCK_M / BLOCK_N of the weight tile's size, so this adds little conversion work and
  saves a launch and an HBM round trip; the MMAs see the same bf16 values in the same K order either way.
Every product is exact, so the result equals the reference up to the order of the fp32 additions.

FP4 -> bf16 in integer ops, the scale folded into the exponent: for magnitude code c (values 0, .5, 1, 1.5,
2, 3, 4, 6) and scale 2^(e-127), c >= 2 gives bf16 bits (c << 6) + ((e - 1) << 7) (exponent (c >> 1) + e - 1,
mantissa bit c & 1); c = 1 (0.5 x 2^(e-127)) gives (e - 1) << 7, or the subnormal 0x40 when e = 1; c = 0 gives 0.
The sign moves from bit 3 to bit 15. Exact for 1 <= e <= 252 (test_gemm_swapab.py checks every code at 16 scales;
the FP4 quantizer's smallest scale is e = 1). That is about 12 integer instructions per weight value, one value
per 32-bit lane, and at 64 tokens per expert (1-GPU prefill routing) they, not the MMAs, set the kernel's time.

FP4_ASM (CUDA only; the interpreter cannot run PTX) converts two values per 32-bit register in inline PTX
(`fp4_bytes_to_bf16`): a nibble's three magnitude bits placed at bf16 bits 6-8 and its sign at bit 15 read as
code x 2^-126 (code 1, i.e. 0.5, is the bf16 subnormal 2^-127), so exact bf16x2 multiplies by 2^126 and by the
scale 2^(e-127) give the dequantized pair. ptxas output for the 128 x 128 contiguous tile: 305 instructions per
64-wide K step against 722 (docs/reports/deepgemm-fp4-ptx.md). Exact for 1 <= e <= 254 (test_gemm_swapab.py
checks all 256 bytes at 16 scales).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gemm_kernel import program_tile, ue8m0_to_fp32


@triton.jit
def fp4_to_bf16_scaled(nibble, e_minus_1_shl7):
    """int32 e2m1 codes (0..15) times 2^(e-127), with e_minus_1_shl7 = (e - 1) << 7 -> bf16, exactly."""
    c = nibble & 7
    # code 1 is 2^(e-128): exponent field e - 1, or for e = 1 the subnormal 0x40 (max(0, 64))
    mag = tl.where(c >= 2, (c << 6) + e_minus_1_shl7, c * tl.maximum(e_minus_1_shl7, 64))
    bits = mag | ((nibble & 8) << 12)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


# FP4_ASM: one PTX block per nibble (low or high), over 4 packed bytes ($2) -> their 4 bf16 code values, bytes
# (0, 1) in $0 and (2, 3) in $1. Kept unary (one operand, one result), the form Triton may move into the MMA's
# register layout (here it does not: like the integer path, the bf16 weights pass through shared memory once
# more before the MMA's register load; the PTX only cuts the conversion work). prmt spreads bytes (0, 1) / (2, 3)
# to the two 16-bit halves of a register; the and-mul-and moves a nibble's magnitude to bits 6-8 and its sign to
# bit 15 (the mask keeps the multiply's two shifted copies apart, so it adds no carries): that reads as
# code x 2^-126, and an exact bf16x2 multiply by 2^126 gives the code's value (code 1, i.e. 0.5, passes through
# the bf16 subnormal 2^-127).
_FP4_NIBBLE_PTX = """
{
.reg .b32 z, two126, b01, b23, u;
mov.b32 z, 0;
mov.b32 two126, 0x7E807E80;
prmt.b32 b01, $2, z, 0x4140;
prmt.b32 b23, $2, z, 0x4342;
and.b32 u, b01, MASK; mul.lo.u32 u, u, SHIFTS; and.b32 u, u, 0x81C081C0; mul.rn.bf16x2 $0, u, two126;
and.b32 u, b23, MASK; mul.lo.u32 u, u, SHIFTS; and.b32 u, u, 0x81C081C0; mul.rn.bf16x2 $1, u, two126;
}
"""
_FP4_LOW_NIBBLE_PTX = tl.constexpr(_FP4_NIBBLE_PTX.replace("MASK", "0x000F000F").replace("SHIFTS", "0x1040"))
_FP4_HIGH_NIBBLE_PTX = tl.constexpr(_FP4_NIBBLE_PTX.replace("MASK", "0x00F000F0").replace("SHIFTS", "0x104"))


@triton.jit
def fp4_bytes_to_bf16(packed, scale):
    """uint8 bytes of two e2m1 codes (low nibble first), bf16 scales (powers of two, broadcastable) ->
    (low nibbles, high nibbles) x scale as bf16, exactly. CUDA only (inline PTX, sm_90+)."""
    lo = tl.inline_asm_elementwise(_FP4_LOW_NIBBLE_PTX, "=r,=r,r", [packed], dtype=tl.bfloat16, is_pure=True, pack=4)
    hi = tl.inline_asm_elementwise(_FP4_HIGH_NIBBLE_PTX, "=r,=r,r", [packed], dtype=tl.bfloat16, is_pure=True, pack=4)
    return lo * scale, hi * scale


@triton.jit
def fp8_to_bf16_scaled(q, e):
    """e4m3 values times 2^(e - 127), e the int32 UE8M0 bytes (broadcastable) -> bf16, exactly: q * 2^(e-127) has
    at most 4 significant bits."""
    return (q.to(tl.float32) * ue8m0_to_fp32(e)).to(tl.bfloat16)


# dequant_act_kernel's ROW_FILTER: which rows of q the pass writes
ALL_ROWS: tl.constexpr = tl.constexpr(0)
LAYOUT_ROWS: tl.constexpr = tl.constexpr(1)
MASKED_ROWS: tl.constexpr = tl.constexpr(2)


@triton.jit
def dequant_act_kernel(q_ptr, s_ptr, out_ptr, rows_ptr, M, K, rows_per_group, stride_q, stride_s, stride_out,
                       PERMUTE_FP4: tl.constexpr, ROW_FILTER: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """out[m, k] = q[m, src(k)] * 2^(s[m, src(k) // 32] - 127) in bf16; src(k) = k, or with PERMUTE_FP4 the
    [even | odd] order inside each 64-block (out's k < 32 of a block holds q's even columns).
    ROW_FILTER: ALL_ROWS; LAYOUT_ROWS: rows_ptr is the contiguous layout (int32 [M]) and rows whose id is -1 are
    neither read nor written (the grouped GEMM stores no output for them; 4,096 tokens routed to 6 of 256 experts
    in 128-row segments leave a quarter of the rows padding); MASKED_ROWS: q holds groups of rows_per_group rows and rows_ptr their used counts (masked_m, int32
    [M / rows_per_group]), rows past a group's count are skipped the same way. A program whose rows are all skipped
    returns at once: at decode (~8 of 128 rows per expert) the pass otherwise spent ~50 us on address arithmetic for
    rows it never touched (session 17 profile, docs/reports/deepgemm-activation-pass.md).
    PERMUTE_FP4 reads q as int16 pairs (columns 2p, 2p + 1: both go to the 64-block of column 2p, at its positions p %
    32 and 32 + p % 32, and share one scale), so the loads are contiguous; q's rows must be 2-byte aligned (K even)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < M
    if ROW_FILTER == LAYOUT_ROWS:
        row_ok = row_ok & (tl.load(rows_ptr + offs_m, mask=row_ok, other=-1) >= 0)
    if ROW_FILTER == MASKED_ROWS:
        used = tl.load(rows_ptr + offs_m // rows_per_group, mask=row_ok, other=0)
        row_ok = row_ok & (offs_m % rows_per_group < used)
    if ROW_FILTER != ALL_ROWS:
        if tl.max(row_ok.to(tl.int32), axis=0) == 0:
            return
    rows = offs_m.to(tl.int64)[:, None]
    if PERMUTE_FP4:
        offs_p = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)  # column pairs
        mask = row_ok[:, None] & (offs_p < K // 2)[None, :]
        pair = tl.load(q_ptr.to(tl.pointer_type(tl.int16)) + rows * (stride_q // 2) + offs_p[None, :], mask=mask,
                       other=0)
        e = tl.load(s_ptr + rows * stride_s + (offs_p // 16)[None, :], mask=mask, other=127).to(tl.int32)
        even = (pair & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        odd = ((pair >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        dst = out_ptr + rows * stride_out + (offs_p + (offs_p // 32) * 32)[None, :]
        tl.store(dst, fp8_to_bf16_scaled(even, e), mask=mask)
        tl.store(dst + 32, fp8_to_bf16_scaled(odd, e), mask=mask)
    else:
        offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (offs_k < K)[None, :]
        q = tl.load(q_ptr + rows * stride_q + offs_k[None, :], mask=mask, other=0.0)
        e = tl.load(s_ptr + rows * stride_s + (offs_k // 32)[None, :], mask=mask, other=127).to(tl.int32)
        tl.store(out_ptr + rows * stride_out + offs_k[None, :], fp8_to_bf16_scaled(q, e), mask=mask)


@triton.jit
def block_scales(row_ptrs, block, WORDS: tl.constexpr):
    """The two UE8M0 scales (int32, one per 32 of K) of 64-block `block` of each row: row_ptrs point at the rows'
    first scale byte, or with WORDS at it as an int32 word (rows must then hold a multiple of 4 scales: K % 128 == 0).
    Why words: Triton 3.6 pipelines (cp.async, issued num_stages steps ahead) only loads of >= 4 bytes per thread;
    a byte load is waited for in the step that needs it, which made decode tiles latency-bound."""
    if WORDS:
        word = tl.load(row_ptrs + block // 2)
        shift = (block % 2) * 16
        return (word >> shift) & 0xFF, (word >> (shift + 8)) & 0xFF
    return tl.load(row_ptrs + 2 * block).to(tl.int32), tl.load(row_ptrs + 2 * block + 1).to(tl.int32)


@triton.jit
def swapab_gemm_kernel(
    x_ptr, sx_ptr, w_ptr, sw_ptr, d_ptr, group_ptr,
    M, N, K,
    stride_x_g, stride_x, stride_sx_g, stride_sx,
    stride_w_g, stride_w_n, stride_sw_g, stride_sw_n,
    stride_d_g, stride_d,
    W_IS_FP4: tl.constexpr,
    FP4_ASM: tl.constexpr,  # FP4 conversion in inline PTX (fp4_bytes_to_bf16), else fp4_to_bf16_scaled
    X_FP8: tl.constexpr,  # x is e4m3 with UE8M0 scales sx, dequantized per tile here; else bf16 from the pass
    SW_GRAN_N: tl.constexpr,  # weight rows per scale: 32 (FP8 32x32 blocks) or 1 (FP4)
    LAYOUT: tl.constexpr,  # 0 dense, LAYOUT_CONTIGUOUS, LAYOUT_MASKED
    SCALE_WORDS: tl.constexpr,  # scales loaded as 32-bit words (block_scales)
    SUBS: tl.constexpr,  # 64-wide K blocks per loop step
    BLOCK_N: tl.constexpr,  # weight rows per tile (the MMA's M)
    BLOCK_M: tl.constexpr,  # tokens per tile (the MMA's N)
    GROUP_M: tl.constexpr,
):
    """d[m, n] = sum_k x[m, k] * dequant(w)[n, k]. x: bf16 [M, K] from dequant_act_kernel (FP4 weights: in its
    K order), or with X_FP8 the e4m3 activations [M, K] (masked: [G, M, K]) and their UE8M0 bytes [.., K / 32];
    both give the MMAs the same bf16 operands in the same K order."""
    offs_m, offs_n, skip, row_ok, weight_group, token_group = program_tile(group_ptr, M, N, LAYOUT, BLOCK_M, BLOCK_N,
                                                                            GROUP_M)
    if skip:
        return
    x_base = x_ptr + token_group * stride_x_g
    sx_base = sx_ptr + token_group * stride_sx_g
    w_base = w_ptr + weight_group * stride_w_g
    sw_base = sw_ptr + weight_group * stride_sw_g
    d_base = d_ptr + token_group * stride_d_g
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    j = tl.arange(0, 32)
    if X_FP8 and W_IS_FP4:  # a whole 64-block of e4m3 bytes, split into even and odd columns in registers
        x_ptrs = x_base + rows[:, None] * stride_x + tl.arange(0, 64)[None, :]
    else:
        x_ptrs = x_base + rows[:, None] * stride_x + j[None, :]
    sx_rows = sx_base + rows * stride_sx
    sw_rows = sw_base + (cols // SW_GRAN_N) * stride_sw_n
    if SCALE_WORDS:  # 4 UE8M0 bytes (two 64-blocks) per 32-bit load, so the pipeliner makes it an async copy
        sx_rows = sx_rows.to(tl.pointer_type(tl.int32))
        sw_rows = sw_rows.to(tl.pointer_type(tl.int32))
    w_ptrs = w_base + cols[:, None] * stride_w_n + j[None, :]  # FP4: 32 bytes = 64 values of K; FP8: 32 values
    second_group = (j >= 16)[None, :]  # FP4 order: even (odd) columns 32..62 of a 64-block use its second scale
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(0, K // (64 * SUBS)):
        for s in tl.static_range(SUBS):
            if X_FP8:
                ex0, ex1 = block_scales(sx_rows, i * SUBS + s, SCALE_WORDS)
                ex0 = ex0[:, None]
                ex1 = ex1[:, None]
                if W_IS_FP4:
                    x_even, x_odd = tl.split(tl.reshape(tl.load(x_ptrs + 64 * s), (BLOCK_M, 32, 2)))
                    ex = tl.where(second_group, ex1, ex0)
                    x0 = fp8_to_bf16_scaled(x_even, ex)
                    x1 = fp8_to_bf16_scaled(x_odd, ex)
                else:
                    x0 = fp8_to_bf16_scaled(tl.load(x_ptrs + 64 * s), ex0)
                    x1 = fp8_to_bf16_scaled(tl.load(x_ptrs + 64 * s + 32), ex1)
            else:
                x0 = tl.load(x_ptrs + 64 * s)
                x1 = tl.load(x_ptrs + 64 * s + 32)
            e0, e1 = block_scales(sw_rows, i * SUBS + s, SCALE_WORDS)
            if W_IS_FP4 and FP4_ASM:
                # 2^(e-127) as bf16 bits; bytes 16..31 of the 32 (values 32..63 of the block) use the second scale
                scale = tl.where(second_group, (e1 << 7)[:, None], (e0 << 7)[:, None]).to(tl.int16)
                w0, w1 = fp4_bytes_to_bf16(tl.load(w_ptrs + 32 * s), scale.to(tl.bfloat16, bitcast=True))
            elif W_IS_FP4:
                packed = tl.load(w_ptrs + 32 * s).to(tl.int32)
                e_shl7 = tl.where(second_group, ((e1 - 1) << 7)[:, None], ((e0 - 1) << 7)[:, None])
                w0 = fp4_to_bf16_scaled(packed & 15, e_shl7)  # even k
                w1 = fp4_to_bf16_scaled(packed >> 4, e_shl7)  # odd k
            else:
                w0 = fp8_to_bf16_scaled(tl.load(w_ptrs + 64 * s), e0[:, None])
                w1 = fp8_to_bf16_scaled(tl.load(w_ptrs + 64 * s + 32), e1[:, None])
            acc = tl.dot(w0, tl.trans(x0), acc)
            acc = tl.dot(w1, tl.trans(x1), acc)
        x_ptrs += 64 * SUBS
        w_ptrs += (32 if W_IS_FP4 else 64) * SUBS
    out_ptrs = d_base + offs_m.to(tl.int64)[None, :] * stride_d + offs_n[:, None]
    tl.store(out_ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_ok[None, :] & (offs_n < N)[:, None])
