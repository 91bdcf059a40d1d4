"""Triton device helpers that decode the cache's scale and value formats (shared by the attention and indexer
kernels). Each one reproduces mini_deepgemm.reference's dequantization bit for bit."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ue8m0_to_fp32(e):
    """UE8M0 byte -> 2^(e-127) as fp32, by placing e in the exponent field. e = 0 (2^-127, a denormal) would read
    as 0, but the quantizers never store it (their amax floors keep e >= 1)."""
    return (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_to_fp32(nibble):
    """4-bit e2m1 code (bit 3 = sign) -> fp32, built from its bits: with e = bits 2..1 and m = bit 0 the value is
    2^(e-1) * (1 + m/2) for e > 0 (fp32 exponent field e + 126, mantissa top bit m) and m/2 for e = 0."""
    nibble = nibble.to(tl.int32)
    code = nibble & 7
    e = code >> 1
    m = code & 1
    normal_bits = ((e + 126) << 23) | (m << 22)
    bits = tl.where(e > 0, normal_bits, tl.where(m > 0, 126 << 23, 0))
    bits = bits | ((nibble & 8) << 28)  # sign: bit 3 -> bit 31
    return bits.to(tl.float32, bitcast=True)
