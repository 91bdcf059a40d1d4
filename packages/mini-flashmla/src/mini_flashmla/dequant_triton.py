"""Triton device helpers that decode the cache's scale and value formats (shared by the attention and indexer
kernels). They produce bf16 directly: every dequantized value of V4.1's cache has at most 5 significant bits, so
value * scale is exact in bf16 and equals mini_deepgemm.reference's fp32 dequantization rounded to bf16, bit for
bit, at half the registers of an fp32 detour."""

from __future__ import annotations

import triton
import triton.language as tl
from mini_deepgemm.gemm_swapab_kernel import fp4_bytes_to_bf16


@triton.jit
def ue8m0_to_bf16(e):
    """UE8M0 byte -> 2^(e-127) as bf16 (same exponent bias as fp32), by placing e in the exponent field. e = 0
    (2^-127, a denormal) would read as 0, but the quantizers never store it (their amax floors keep e >= 1)."""
    return (e.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_to_bf16(nibble):
    """4-bit e2m1 code (bit 3 = sign) -> bf16, built from its bits: with e = bits 2..1 and m = bit 0 the value is
    2^(e-1) * (1 + m/2) for e > 0 (bf16 exponent field e + 126, mantissa top bit m) and m/2 for e = 0."""
    nibble = nibble.to(tl.int16)
    code = nibble & 7
    e = code >> 1
    m = code & 1
    normal_bits = ((e + 126) << 7) | (m << 6)
    bits = tl.where(e > 0, normal_bits, tl.where(m > 0, 126 << 7, 0).to(tl.int16))
    bits = bits | ((nibble & 8) << 12)  # sign: bit 3 -> bit 15
    return bits.to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_pairs_to_bf16(byte, scale, ASM: tl.constexpr):
    """uint8 bytes of two e2m1 codes (low nibble = even dim) times bf16 scales (powers of two or e4m3 values,
    broadcastable) -> (even, odd) bf16, exactly (at most 5 significant bits). ASM: mini_deepgemm's inline-PTX
    conversion, a few instructions per 4 bytes (CUDA, sm_90+); else the integer path of e2m1_to_bf16 (any backend,
    the interpreter included)."""
    if ASM:
        even, odd = fp4_bytes_to_bf16(byte, scale)
    else:
        even = e2m1_to_bf16(byte & 0xF) * scale
        odd = e2m1_to_bf16(byte >> 4) * scale
    return even, odd
