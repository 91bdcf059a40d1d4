"""Triton device helpers that decode the cache's scale and value formats (shared by the attention and indexer
kernels). They produce bf16 directly: every dequantized value of V4.1's cache has at most 5 significant bits, so
value * scale is exact in bf16 and equals mini_deepgemm.reference's fp32 dequantization rounded to bf16, bit for
bit, at half the registers of an fp32 detour."""

from __future__ import annotations

import triton
import triton.language as tl


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


# One int32 word of e2m1 codes (byte j: dim 2j in its low nibble, 2j + 1 in its high one) -> four bf16x2 words in dim
# order ($0: dims 0, 1 ... $3: dims 6, 7) times $5, the scale as a bf16x2 pair, by byte-permute tables: prmt picks
# byte k of its output from 8 table bytes by nibble k of its selector, so with the codes' magnitudes (sign bit masked)
# as the selector, one prmt gives four values' bf16 high bytes and another their low bytes (H and L below: the bf16
# bits of 0, 0.5, 1, 1.5, 2, 3, 4, 6). A third, in its sign-replicating mode, turns the codes' sign bits (bit 7 of each
# byte of the word and of the word shifted left by 4) into 0xFF / 0x00 bytes whose top bit is or-ed into the high
# bytes, and two more interleave low and high bytes into bf16 pairs. 19 instructions per 8 values with the scale
# multiplies, against 25 for the and-mul-and of the nibble helpers (2^-126 trick, two multiplies per pair).
E2M1_WORD_PTX = tl.constexpr("""
{
.reg .b32 sel, s4, h, l, s;
and.b32 sel, $4, 0x77777777;
shl.b32 s4, $4, 4;
prmt.b32 h, $6, 0x40404040, sel; prmt.b32 l, $7, 0xC0804000, sel; prmt.b32 s, s4, $4, 0xD9C8;
and.b32 s, s, 0x80808080; or.b32 h, h, s;
prmt.b32 $0, l, h, 0x5140; prmt.b32 $1, l, h, 0x7362;
mul.rn.bf16x2 $0, $0, $5; mul.rn.bf16x2 $1, $1, $5;
shr.b32 sel, sel, 16;
prmt.b32 h, $6, 0x40404040, sel; prmt.b32 l, $7, 0xC0804000, sel; prmt.b32 s, s4, $4, 0xFBEA;
and.b32 s, s, 0x80808080; or.b32 h, h, s;
prmt.b32 $2, l, h, 0x5140; prmt.b32 $3, l, h, 0x7362;
mul.rn.bf16x2 $2, $2, $5; mul.rn.bf16x2 $3, $3, $5;
}
""")


# E2M1_WORD_PTX's $6 and $7: the low words of its high- and low-byte tables (their high words are immediates; prmt
# takes one). As constants, ptxas kept them in uniform registers and copied each into a register before every prmt
# that read it (4 instructions per word of codes, offline, triton 3.6, sm_90a); or-ed with a per-lane zero that it
# cannot fold (the lanes below and from this one: disjoint masks), they stay in two registers.
E2M1_TABLES_PTX = tl.constexpr("{ .reg .b32 lt, ge; mov.u32 lt, %lanemask_lt; mov.u32 ge, %lanemask_ge; "
                               "and.b32 lt, lt, ge; or.b32 $0, lt, 0x3F3F3F00; or.b32 $1, lt, 0xC0800000; }")


@triton.jit
def e2m1_tables():
    """(high-byte table, low-byte table) low words for e2m1_words_to_bf16: int32 scalars; make them once, outside the
    loop that decodes."""
    return tl.inline_asm_elementwise(E2M1_TABLES_PTX, "=r,=r", [], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def bf16_pair(scale):
    """bf16 scales -> int32 words holding the scale in both bf16 halves (E2M1_WORD_PTX's multiplier)."""
    return (scale.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) * 0x10001


@triton.jit
def e2m1_words_to_bf16(words, scale_pair, tables):
    """int32 [..., W] words of 8 e2m1 codes each (byte j: dim 2j in its low nibble, 2j + 1 in its high one) times
    scale_pair (int32 bf16x2 words, bf16_pair; broadcastable to words) -> bf16 [..., 8 W] in dim order, exactly (at
    most 5 significant bits). tables: e2m1_tables(). CUDA only (inline PTX)."""
    d01, d23, d45, d67 = tl.inline_asm_elementwise(E2M1_WORD_PTX, "=r,=r,=r,=r,r,r,r,r",
                                                   [words, scale_pair, tables[0], tables[1]],
                                                   dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True,
                                                   pack=1)
    pairs = tl.join(tl.join(d01, d45), tl.join(d23, d67))  # [..., W, i, j]: output word 2i + j (dims 4i + 2j, + 1)
    values = tl.join(pairs.to(tl.int16).to(tl.bfloat16, bitcast=True),
                     (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True))
    return tl.reshape(values, words.shape[:-1] + [8 * words.shape[-1]])


@triton.jit
def e2m1_pairs_to_bf16(byte, scale):
    """uint8 bytes of two e2m1 codes (low nibble = even dim) times bf16 scales (powers of two or e4m3 values,
    broadcastable) -> (even, odd) bf16, exactly (at most 5 significant bits), by integer ops on any backend (the
    interpreter included); on CUDA the kernels read whole words through e2m1_words_to_bf16 instead."""
    return e2m1_to_bf16(byte & 0xF) * scale, e2m1_to_bf16(byte >> 4) * scale
