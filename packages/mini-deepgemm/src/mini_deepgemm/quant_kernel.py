"""Triton kernels of the per-token, per-group activation quantizers: FP8 (reference: reference.act_quant, and its
round trip reference.fp8_fakequant) and FP4 e2m1 with UE8M0 or e4m3 scales (reference.fp4_quant, and its round trip
reference.fp4_fakequant).

Bit-exact with the reference run on CUDA: the same fp32 operations in the same order (amax clamp,
amax * fp32(1/448), the exponent bit trick for UE8M0, IEEE round-to-nearest x / scale, clamp, RNE cast to
e4m3). For the fp32 scale format the reference's `amax / 448` is, on CUDA, torch's multiply-by-reciprocal
shortcut for a scalar divisor (CPU torch divides exactly; the two differ in the last bit for about half of the
inputs), so the kernel multiplies by fp32(1/448) too. FP4 with UE8M0 scales is exact everywhere: the reference
multiplies amax by fp32(1/6) itself, compares |x| with thresholds x scale (exact: powers of two times values of two
significant bits), and its dequantized values are e2m1 x 2^k, exact in bf16. FP4 with e4m3 scales (the compressed
KV) divides amax by 6 as torch does on CUDA (times fp32(1/6); CPU torch divides exactly, which can move a scale
across an e4m3 rounding boundary in rare cases), so it is bit-exact with the reference run on CUDA; the thresholds
and the dequantized values (e2m1 x e4m3: at most 6 significant bits) are exact.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def quantize_groups(x, UE8M0: tl.constexpr):
    """x fp32 [n, GROUP], one quantization group per row -> (q e4m3 [n, GROUP], the stored scale [n]: the UE8M0
    biased exponent as uint8, or fp32 amax / 448). Shared with the runtime's fused MoE kernels
    (mini_deepinfer/layers/moe_kernels.py), so every FP8 activation is quantized by this one piece of code."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    if UE8M0:
        # s = 2^ceil(log2(amax / 448)): biased exponent, +1 when any mantissa bit is set.
        bits = (amax * (1.0 / 448.0)).to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        e = tl.minimum(tl.maximum(e, 0), 254)
        scale = (e << 23).to(tl.float32, bitcast=True)  # e >= 1 here: amax >= 1e-4
        stored = e.to(tl.uint8)
    else:
        scale = amax * (1.0 / 448.0)
        stored = scale
    q = tl.math.div_rn(x, scale[:, None])
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    return q.to(tl.float8e4nv), stored


@triton.jit
def fold_groups_to_128(q, s, GROUPS: tl.constexpr):
    """quantize_groups' UE8M0 output for GROUPS consecutive 32-column groups (q e4m3 [GROUPS, 32], s biased
    exponents [GROUPS]; every 4 in a row one 128-column block of one row) folded per 128 as
    reference.fold_ue8m0_to_128 does: (q re-expressed under each block's largest exponent e_max, fp32 2^(e_max - 127)
    [GROUPS / 4]). Shared with the runtime's fused MoE kernels, like quantize_groups."""
    FOLDS: tl.constexpr = GROUPS // 4
    e = s.to(tl.int32)
    e_max = tl.max(tl.reshape(e, [FOLDS, 4]), axis=1)
    # 2^-shift from its bits; a shift past 20 takes every e4m3 value (< 2^9) below half the smallest subnormal 2^-9,
    # so clamping it at 30 rounds to the same zero
    shift = tl.minimum(tl.reshape(tl.broadcast_to(e_max[:, None], [FOLDS, 4]), [GROUPS]) - e, 30)
    factor = ((127 - shift) << 23).to(tl.float32, bitcast=True)
    q = (q.to(tl.float32) * factor[:, None]).to(tl.float8e4nv)
    # 2^(e_max - 127): e_max is its fp32 biased exponent (>= 1: amax >= 1e-4)
    return q, (e_max << 23).to(tl.float32, bitcast=True)


@triton.jit
def act_quant_fp8_kernel(
    x_ptr, q_ptr, s_ptr,
    num_groups,  # groups per row (K / GROUP)
    stride_x_m, stride_q_m, stride_s_m,
    GROUP: tl.constexpr,
    GROUPS_PER_PROGRAM: tl.constexpr,
    UE8M0: tl.constexpr,
    FOLD_128: tl.constexpr = False,
    ROUND_TRIP: tl.constexpr = False,
):
    """FOLD_128 (GROUP 32, UE8M0, num_groups % 4 == 0): the values re-expressed under the largest exponent of each
    128 columns and that power of two stored as fp32 per 128 (reference.fold_ue8m0_to_128). ROUND_TRIP (UE8M0):
    q_ptr, in x's dtype, gets the dequantized values (reference.fp8_fakequant; exact: e4m3 times a power of two);
    s_ptr is unused."""
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    cols = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = groups[:, None] < num_groups
    x = tl.load(x_ptr + row * stride_x_m + cols, mask=mask, other=0.0).to(tl.float32)
    q, s = quantize_groups(x, UE8M0)
    if ROUND_TRIP:
        scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        v = q.to(tl.float32) * scale[:, None]
        tl.store(q_ptr + row * stride_q_m + cols, v.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        if FOLD_128:
            q, folded_scale = fold_groups_to_128(q, s, GROUPS_PER_PROGRAM)
            folds = tl.program_id(1) * (GROUPS_PER_PROGRAM // 4) + tl.arange(0, GROUPS_PER_PROGRAM // 4)
            tl.store(s_ptr + row * stride_s_m + folds, folded_scale, mask=folds < num_groups // 4)
        else:
            tl.store(s_ptr + row * stride_s_m + groups, s, mask=groups < num_groups)
        tl.store(q_ptr + row * stride_q_m + cols, q, mask=mask)


@triton.jit
def fp4_quantize_groups(x, E4M3: tl.constexpr):
    """x fp32 [n, GROUP], one group per row -> (nibbles int32 [n, GROUP]: bit 3 the sign, bits 0-2 the e2m1
    magnitude code, round half to even and saturating at 6; the scale fp32 [n]; its stored byte int32 [n]):
    reference.fp4_quant. UE8M0 (E4M3 False): s = 2^ceil(log2(amax / 6)), the byte its biased exponent. E4M3:
    s = e4m3(max(amax, 6 * 2^-9) / 6) with the division as torch runs it on CUDA (times fp32(1/6)) and torch's
    non-saturating cast (NaN above 464, where rounding passes 448), the byte its e4m3 bits."""
    amax = tl.max(tl.abs(x), axis=1)
    if E4M3:
        v = tl.maximum(amax, 6.0 * 2.0**-9) * (1.0 / 6.0)
        s8 = v.to(tl.float8e4nv)  # round to nearest even (saturating: the overflow is made NaN below)
        scale = tl.where(v > 464.0, float("nan"), s8.to(tl.float32))
        byte = tl.where(v > 464.0, 0x7F, s8.to(tl.uint8, bitcast=True).to(tl.int32))
    else:
        amax = tl.maximum(amax, 6.0 * 2.0**-126)
        # s = 2^ceil(log2(amax / 6)): biased exponent, +1 when any mantissa bit is set (>= 1 after the clamp)
        bits = (amax * (1.0 / 6.0)).to(tl.int32, bitcast=True)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        byte = tl.minimum(tl.maximum(e, 0), 254)
        scale = (byte << 23).to(tl.float32, bitcast=True)
    a, s = tl.abs(x), scale[:, None]
    # the grid's midpoints: ">" where a tie rounds down to the even code, ">=" where it rounds up to it (t x s is
    # exact in fp32 for both scale formats: at most 3 + 4 significant bits)
    code = ((a > 0.25 * s).to(tl.int32) + (a >= 0.75 * s).to(tl.int32) + (a > 1.25 * s).to(tl.int32)
            + (a >= 1.75 * s).to(tl.int32) + (a > 2.5 * s).to(tl.int32) + (a >= 3.5 * s).to(tl.int32)
            + (a > 5.0 * s).to(tl.int32))
    return code | ((x < 0).to(tl.int32) << 3), scale, byte


@triton.jit
def fp4_quant_kernel(x_ptr, out_ptr, s_ptr, n_groups, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr,
                     ROUND_TRIP: tl.constexpr, E4M3: tl.constexpr = False):
    """x: [n_groups, GROUP] contiguous (any float dtype). ROUND_TRIP: out [n_groups, GROUP] in its own dtype gets the
    dequantized values (reference.fp4_fakequant; s_ptr unused); else out uint8 [n_groups, GROUP / 2] the packed
    nibbles (low nibble = even column) and s uint8 [n_groups] the scale bytes (UE8M0 exponents, or e4m3 bits with
    E4M3)."""
    g = (tl.program_id(0) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)).to(tl.int64)
    mask = (g < n_groups)[:, None]
    cols = tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + g[:, None] * GROUP + cols, mask=mask, other=0.0).to(tl.float32)
    nib, scale, byte = fp4_quantize_groups(x, E4M3)
    if ROUND_TRIP:
        # e2m1 magnitude of code c = (exponent field f, mantissa bit m): 0.5 m when f = 0, else 2^(f - 1) (1 + m / 2)
        f, m = (nib >> 1) & 3, (nib & 1).to(tl.float32)
        mag = tl.where(f == 0, 0.5 * m, (1.0 + 0.5 * m) * ((f + 126) << 23).to(tl.float32, bitcast=True))
        # the sign as a bit: a negative value that rounds to code 0 is -0.0 in the reference, and a float negation
        # of a zero product may be folded away (session 31 run 1: +0.0 on the GPU, -0.0 under the interpreter)
        v = (mag * scale[:, None]).to(tl.int32, bitcast=True) | ((nib >> 3) << 31)
        tl.store(out_ptr + g[:, None] * GROUP + cols, v.to(tl.float32, bitcast=True).to(out_ptr.dtype.element_ty),
                 mask=mask)
    else:
        even, odd = tl.split(tl.reshape(nib, [GROUPS_PER_PROGRAM, GROUP // 2, 2]))
        half = tl.arange(0, GROUP // 2)[None, :]
        tl.store(out_ptr + g[:, None] * (GROUP // 2) + half, (even | (odd << 4)).to(tl.uint8), mask=mask)
        tl.store(s_ptr + g, byte.to(tl.uint8), mask=g < n_groups)
