"""Triton kernel of the scaled NT GEMMs: D[M, N] = (A * sa) @ (B * sb)^T (+ C), fp32 accumulation.

One kernel serves every public GEMM (dense, M-grouped contiguous, M-grouped masked; B FP8 or packed FP4); the
variants are compile-time switches, so each compiles to a specialised kernel.

How the fine-grained scales are applied (the cost centre of this family): scales live on GRAN_K-wide slices of
K (32 for V4.1, 128 for the V3 recipe), and A's scale changes per row and per slice. One of two strategies
(compile-time switch BF16_MMA) applies them:
- FP8 MMA + promotion (any scale format): the K loop steps by exactly GRAN_K; each step does one FP8 MMA into
  a fresh fp32 tile, promoted into the running fp32 accumulator times sa[m] * sb[n]. The promotion is an FMA
  per accumulator element per step on the CUDA cores, and the MMA must finish before it, so at GRAN_K = 32 it
  and the fixed cost of each short step dominate.
- Dequantize to bf16 + bf16 MMA (UE8M0 scales only): q * 2^e of an e4m3 (or e2m1) value has at most 4
  significant bits, so it is exact in bf16. Each step loads BLOCK_K (a multiple of GRAN_K) of both operands,
  multiplies each GRAN_K slice by its scale in registers and feeds a bf16 MMA that accumulates in place: no
  promotion and long steps, at half the FP8 MMA rate.
Both compute exact products of the dequantized operands, so the result differs from the fp32 reference only
in the order of the fp32 additions.

FP4 weights (Hopper has no FP4 MMA): each e2m1 nibble is rewritten as the e4m3 byte of the same value with
integer ops (every e2m1 value is exactly representable in e4m3); the weight's UE8M0 scale is applied in the
fp32 promotion like any other B scale.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Layout codes (gemm.py passes the same numbers; 0 is dense).
LAYOUT_CONTIGUOUS: tl.constexpr = tl.constexpr(1)
LAYOUT_MASKED: tl.constexpr = tl.constexpr(2)


@triton.jit
def ue8m0_to_fp32(e):
    """UE8M0 byte -> 2^(e-127) as fp32 by placing e in the exponent field. e = 0 (2^-127, an fp32 subnormal)
    would read as 0; the V4.1 quantizers never produce it (their amax clamps keep e >= 1)."""
    return (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1x2_to_e4m3(packed):
    """[R, C] bytes holding two e2m1 codes each (low nibble = even column) -> [R, 2C] float8e4nv, exactly.

    Magnitude code c (value table 0, .5, 1, 1.5, 2, 3, 4, 6): c >= 2 are normal e2m1 numbers whose e4m3 byte
    is (c << 2) + 0x30 (exponent re-biased from 1 to 7, the mantissa bit moved to the top of e4m3's three);
    c = 1 is e2m1's subnormal 0.5 = e4m3 0x30; c = 0 is 0. The sign bit moves from bit 3 to bit 7."""
    p = packed.to(tl.int32)
    lo = p & 7
    hi = (p >> 4) & 7
    lo8 = tl.where(lo >= 2, (lo << 2) + 0x30, lo * 0x30) | ((p & 0x08) << 4)
    hi8 = tl.where(hi >= 2, (hi << 2) + 0x30, hi * 0x30) | (p & 0x80)
    pairs = tl.join(lo8, hi8)  # [R, C, 2]: even column first
    out = tl.reshape(pairs, (packed.shape[0], 2 * packed.shape[1]))
    return out.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def dequant_to_bf16(q, scale, GRAN_K: tl.constexpr):
    """q [R, BK] (e4m3) times scale [R, BK / GRAN_K] (fp32, one per GRAN_K slice of each row) -> bf16 [R, BK],
    exact for power-of-two scales."""
    R: tl.constexpr = q.shape[0]
    BK: tl.constexpr = q.shape[1]
    x = tl.reshape(q.to(tl.float32), (R, BK // GRAN_K, GRAN_K)) * scale[:, :, None]
    return tl.reshape(x, (R, BK)).to(tl.bfloat16)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program `pid`: GROUP_M row tiles share each sweep over the column tiles, so the
    B tiles they read are re-read from L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_sweep = GROUP_M * num_pid_n
    first_m = (pid // tiles_per_sweep) * GROUP_M
    sweep_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % tiles_per_sweep) % sweep_m, (pid % tiles_per_sweep) // sweep_m


@triton.jit
def program_tile(group_ptr, M, N, LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """The prologue of this package's Triton GEMM kernels: this program's output tile and where its operands
    live in the grouped layouts. Returns (offs_m [BLOCK_M], offs_n [BLOCK_N]: the tile's rows and columns, which may
    run past M and N; skip: the tile has no rows to compute, and the kernel returns at once; row_ok: its rows that
    do; weight_group: the int64 group of its weights; token_group: the int64 group of its activations and outputs).
    Dense: group 0, rows below M. Contiguous: one group per tile (segments start on multiples of the tile height, so
    a tile holds one group plus, at its end, padding -1), activations not grouped; an all-padding tile is skipped.
    Masked: the group is grid axis 1 for both, and group g uses rows [0, masked_m[g])."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if LAYOUT == LAYOUT_CONTIGUOUS:
        ids = tl.load(group_ptr + offs_m, mask=offs_m < M, other=-1)
        group = tl.max(ids, axis=0)
        return offs_m, offs_n, group < 0, ids == group, group.to(tl.int64), 0
    elif LAYOUT == LAYOUT_MASKED:
        group = tl.program_id(1)
        rows_in_group = tl.load(group_ptr + group)
        skip = pid_m * BLOCK_M >= rows_in_group
        return offs_m, offs_n, skip, offs_m < rows_in_group, group.to(tl.int64), group.to(tl.int64)
    else:
        return offs_m, offs_n, False, offs_m < M, 0, 0


@triton.jit
def scaled_gemm_nt_kernel(
    a_ptr, sa_ptr, b_ptr, sb_ptr, d_ptr, c_ptr, group_ptr,
    M, N, K,
    stride_a_g, stride_a_m, stride_sa_g, stride_sa_m,
    stride_b_g, stride_b_n, stride_sb_g, stride_sb_n,
    stride_d_g, stride_d_m,
    GRAN_K: tl.constexpr,  # K elements per scale
    SB_GRAN_N: tl.constexpr,  # B rows per scale: 32 (V4.1 FP8), 128 (V3), 1 (FP4)
    B_IS_FP4: tl.constexpr,
    UE8M0_SCALES: tl.constexpr,  # scales are UE8M0 bytes (else fp32)
    LAYOUT: tl.constexpr,  # 0 dense, LAYOUT_CONTIGUOUS, LAYOUT_MASKED
    HAS_C: tl.constexpr,
    BF16_MMA: tl.constexpr,  # dequantize to bf16 and use bf16 MMAs (needs UE8M0 scales)
    BLOCK_K: tl.constexpr,  # K per loop step: GRAN_K for FP8 MMAs, a multiple of it for bf16 MMAs
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    offs_m, offs_n, skip, row_ok, weight_group, token_group = program_tile(group_ptr, M, N, LAYOUT, BLOCK_M, BLOCK_N,
                                                                            GROUP_M)
    if skip:
        return
    a_base = a_ptr + token_group * stride_a_g
    sa_base = sa_ptr + token_group * stride_sa_g
    b_base = b_ptr + weight_group * stride_b_g
    sb_base = sb_ptr + weight_group * stride_sb_g
    d_base = d_ptr + token_group * stride_d_g
    c_base = c_ptr + token_group * stride_d_g

    # Out-of-range rows/columns read a valid row instead (wrap), so the K loop needs no load masks;
    # their results are dropped by the store mask.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    SCALES_PER_STEP: tl.constexpr = BLOCK_K // GRAN_K
    tl.static_assert(BF16_MMA or SCALES_PER_STEP == 1, "FP8 MMAs step one scale group at a time")
    B_STEP: tl.constexpr = BLOCK_K // 2 if B_IS_FP4 else BLOCK_K  # bytes of one B row per K step
    a_ptrs = a_base + rows[:, None] * stride_a_m + tl.arange(0, BLOCK_K)[None, :]
    b_ptrs = b_base + cols[:, None] * stride_b_n + tl.arange(0, B_STEP)[None, :]
    offs_s = tl.arange(0, SCALES_PER_STEP)
    sa_ptrs = sa_base + rows[:, None] * stride_sa_m + offs_s[None, :]
    sb_ptrs = sb_base + (cols // SB_GRAN_N)[:, None] * stride_sb_n + offs_s[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if B_IS_FP4:
            b = e2m1x2_to_e4m3(b)
        if UE8M0_SCALES:
            sa = ue8m0_to_fp32(tl.load(sa_ptrs))
            sb = ue8m0_to_fp32(tl.load(sb_ptrs))
        else:
            sa = tl.load(sa_ptrs)
            sb = tl.load(sb_ptrs)
        if BF16_MMA:
            acc = tl.dot(dequant_to_bf16(a, sa, GRAN_K), tl.trans(dequant_to_bf16(b, sb, GRAN_K)), acc)
        else:
            partial = tl.dot(a, tl.trans(b))
            acc += partial * (tl.reshape(sa, (BLOCK_M, 1)) * tl.reshape(sb, (1, BLOCK_N)))
        a_ptrs += BLOCK_K
        b_ptrs += B_STEP
        sa_ptrs += SCALES_PER_STEP
        sb_ptrs += SCALES_PER_STEP

    out_offs = offs_m.to(tl.int64)[:, None] * stride_d_m + offs_n[None, :]
    out_mask = row_ok[:, None] & (offs_n < N)[None, :]
    if HAS_C:
        acc += tl.load(c_base + out_offs, mask=out_mask, other=0.0)
    tl.store(d_base + out_offs, acc.to(d_ptr.dtype.element_ty), mask=out_mask)
