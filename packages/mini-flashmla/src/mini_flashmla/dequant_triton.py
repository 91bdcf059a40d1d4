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


def _e2m1_lookup_ptx(word: str, high_table: str, low_table: str) -> str:
    """PTX that decodes the 8 e2m1 codes of `word` (byte j: code 2j in its low nibble, 2j + 1 in its high one) into
    their bf16 bytes, by byte-permute tables: prmt picks byte k of its output from 8 table bytes by nibble k of its
    selector, so with the codes' magnitudes (sign bits masked) as the selector, one prmt gives four codes' bf16 high
    bytes (h: codes 0-3, hb: 4-7) and another their low bytes (l, lb). The tables are the bf16 bits of 0, 0.5, 1, 1.5,
    2, 3, 4, 6: their low words come in registers (high_table, low_table: E2M1_*_TABLE_PTX), their high words as
    immediates (prmt takes one). A third prmt, in its sign-replicating mode, turns the codes' sign bits (bit 7 of
    each byte of the word and of the word shifted left by 4) into 0xFF / 0x00 bytes whose top bit is or-ed into the
    high bytes. 12 instructions per word; the caller's prmts then pair low and high bytes into bf16x2 words."""
    half = """prmt.b32 {h}, {ht}, 0x40404040, sel; prmt.b32 {l}, {lt}, 0xC0804000, sel; prmt.b32 s, s4, {w}, {signs};
and.b32 s, s, 0x80808080; or.b32 {h}, {h}, s;
"""
    return (f"and.b32 sel, {word}, 0x77777777;\nshl.b32 s4, {word}, 4;\n"
            + half.format(h="h", l="l", ht=high_table, lt=low_table, w=word, signs="0xD9C8")
            + "shr.b32 sel, sel, 16;\n"
            + half.format(h="hb", l="lb", ht=high_table, lt=low_table, w=word, signs="0xFBEA"))


# One int32 word of codes ($4) -> four bf16x2 words in dim order ($0: codes 0, 1 ... $3: codes 6, 7) times $5, the
# scale as a bf16x2 pair; table words $6, $7 (E2M1_HIGH_TABLE_PTX, E2M1_LOW_TABLE_PTX) (the Gluon attention kernel's quantized producer: 19 instructions per word,
# against 25 for the and-mul-and of mini-deepgemm's nibble helpers, whose 2^-126 trick takes two multiplies per pair).
E2M1_WORD_PTX = tl.constexpr("{\n.reg .b32 sel, s4, s, h, l, hb, lb;\n" + _e2m1_lookup_ptx("$4", "$6", "$7") + """
prmt.b32 $0, l, h, 0x5140; prmt.b32 $1, l, h, 0x7362; prmt.b32 $2, lb, hb, 0x5140; prmt.b32 $3, lb, hb, 0x7362;
mul.rn.bf16x2 $0, $0, $5; mul.rn.bf16x2 $1, $1, $5; mul.rn.bf16x2 $2, $2, $5; mul.rn.bf16x2 $3, $3, $5;
}""")
# Four packed bytes ($4) -> their low-nibble codes ($0: bytes 0, 1; $1: bytes 2, 3) and high-nibble codes ($2, $3) as
# bf16, table words $5 and $9 (pack = 4 passes a 32-bit tensor as four operands, one per byte): the form
# of e2m1_pairs_to_bf16, whose even / odd halves Triton moves into the MMA's register layout without shared memory
# (session 33 run 2: dim-order words went through a shared-memory layout conversion in the per-query indexer, which
# ran 0.86x despite 19% fewer instructions).
E2M1_BYTES_PTX = tl.constexpr("{\n.reg .b32 sel, s4, s, h, l, hb, lb;\n" + _e2m1_lookup_ptx("$4", "$5", "$9") + """
prmt.b32 $0, l, h, 0x6240; prmt.b32 $1, lb, hb, 0x6240; prmt.b32 $2, l, h, 0x7351; prmt.b32 $3, lb, hb, 0x7351;
}""")


# The tables' low words ($0; $1 is the decoded tensor, unread, so that the words are elementwise values in its layout),
# or-ed with a per-lane zero that ptxas cannot fold (the lanes below and from this one: disjoint masks) so that they
# stay in registers. As constants, ptxas kept them in uniform registers and copied each into a register before every
# prmt that read it: 4 instructions per word (offline, triton 3.6, sm_90a). As scalars made once outside the loop,
# they kept Triton from computing the decode in the MMA operand's register layout: the per-query indexer's keys went
# through shared memory instead and it ran 0.86x (session 33 run 2).
_E2M1_TABLE_PTX = ("{ .reg .b32 lt, ge; mov.u32 lt, %lanemask_lt; mov.u32 ge, %lanemask_ge; and.b32 lt, lt, ge; "
                   "or.b32 $0, lt, TABLE; }")
E2M1_HIGH_TABLE_PTX = tl.constexpr(_E2M1_TABLE_PTX.replace("TABLE", "0x3F3F3F00"))
E2M1_LOW_TABLE_PTX = tl.constexpr(_E2M1_TABLE_PTX.replace("TABLE", "0xC0800000"))


@triton.jit
def e2m1_pairs_to_bf16(byte, scale, ASM: tl.constexpr):
    """uint8 bytes of two e2m1 codes (low nibble = even dim) times bf16 scales (powers of two or e4m3 values,
    broadcastable) -> (even, odd) bf16, exactly (at most 5 significant bits). ASM: E2M1_BYTES_PTX's table decode
    (CUDA, sm_90+); else the integer ops of e2m1_to_bf16 (any backend, the interpreter included)."""
    if ASM:
        high = tl.inline_asm_elementwise(E2M1_HIGH_TABLE_PTX, "=r,r", [byte], dtype=tl.int32, is_pure=True, pack=1)
        low = tl.inline_asm_elementwise(E2M1_LOW_TABLE_PTX, "=r,r", [byte], dtype=tl.int32, is_pure=True, pack=1)
        even, odd = tl.inline_asm_elementwise(E2M1_BYTES_PTX, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [byte, high, low],
                                              dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        even = e2m1_to_bf16(byte & 0xF)
        odd = e2m1_to_bf16(byte >> 4)
    return even * scale, odd * scale
