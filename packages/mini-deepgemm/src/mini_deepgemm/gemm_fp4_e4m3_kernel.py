"""Triton kernel of the grouped FP8 x FP4 GEMMs on FP8 tensor cores, for wherever the Gluon kernels do not run: a
triton other than 3.6 (the uv lock's), a GPU other than Hopper with FP8 MMAs (sm_89+, the B200 included), or
MINI_DEEPGEMM_GLUON=0 (docs/reports/triton-route-on-hopper.md). Routed unless MINI_DEEPGEMM_TRITON_FP8_MOE=0
(_backend.triton_fp8_moe_enabled, which gives the evidence for its default).

Why: without it those installs ran the MoE GEMMs on the bf16-MMA route (gemm_swapab_kernel): every FP4 weight
converted to bf16, the activations to bf16 by a pass in front, MMAs at half the FP8 rate. On an H200 under triton 3.6
that route ran 2.1-2.6x slower than the Gluon FP8-MMA route (session 72). This kernel takes the same folded operands
as the Gluon kernels (gemm.fold_fp4_weights: the weights in the route's order, a 32-block offset byte per weight row
and 128 of K, a power-of-two scale per weight row; activations folded per 128, fp32 scales), so one fold serves
both routes and the engine runs unchanged.

How: a tile of BLOCK_N weight rows x BLOCK_M tokens in plain `tl`, computed transposed as gemm_swapab_kernel does (D^T
= W X^T). Per K step of 128, each weight row's 64 packed bytes (16 route-order words) become two e4m3 tiles [BLOCK_N,
64] by the Gluon kernels' byte-permute conversion (7 instructions per 8 values, plus 3 per word that build the word's
table from its offset byte here, inside the asm). Word w = 4c + q holds the values at k = 32c + 4q + j (its first four
bytes out) and k + 16 (its last four), so byte j of a row's first tile is k_lo(j) = 32 (j // 16) + j % 16 and of its
second k_lo(j) + 16: the activations are loaded in those two column orders (16-byte runs), and the two tiles are two
FP8 MMAs of K = 64 into one partial sum. Then acc += partial * sx[token, step] (one FMA per element and step), and the
row's 2^(ref - 127) multiplies the result once. Every product is exact in fp32; the sums run in another order than the
Gluon kernels', so the bits may differ from theirs (not from the reference beyond fp32 rounding).

Measured (H100, session 75; docs/reports/triton-route-on-hopper.md): the D = X W^T form (converted weights as the
MMA's shared-memory operand) and promoting each step's partial sum during the next step both lost to this form at
every tile, so neither is kept.

ASM=False (the interpreter, which cannot run PTX) converts with integer ops on the same bytes, exactly as the asm.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gemm_kernel import program_tile

# e4m3 bytes of {0, 0.5, 1, 1.5} x 2^d (low word) and {2, 3, 4, 6} x 2^d (high word) at d = -5; one step of d adds
# 8 (an exponent step) to every byte but the zero's. The offset bytes hold d + 5, in [0, 11] (gemm.fold_fp4_weights).
LUT_LO_BASE = 0x14100800
LUT_LO_STEP = 0x08080800
LUT_HI_BASE = 0x24201C18
LUT_HI_STEP = 0x08080808

# A word of the route's weight order (reference.fp4_to_fp8_mma_order: value i's magnitude in bits 4i..4i+2, the signs
# of values 0-3 in bits 7, 15, 23, 31 and of values 4-7 in bits 3, 11, 19, 27) in WORD, its 32-block's tables in LO /
# HI -> $0: values 0-3 as e4m3 bytes, $1: values 4-7. prmt picks byte (selector nibble & 7) of {LO, HI}: the
# magnitudes (sign bits cleared) index the table. The signs of values 0-3 already sit at their bytes' top bits (one
# AND-OR), those of values 4-7 one nibble below (a shift and an AND-OR): 7 instructions.
E2M1_TO_E4M3_PTX_BODY = """
and.b32 m, WORD, 0x77777777;
prmt.b32 $0, LO, HI, m;
shr.u32 m, m, 16;
prmt.b32 $1, LO, HI, m;
and.b32 t, WORD, 0x80808080;
or.b32 $0, $0, t;
shl.b32 t, WORD, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, $1, t;
"""

# This kernel's form, on 4 bytes of uint8 tensors (pack=4): $2 the word, $3 four copies of its offset byte; the
# tables are built from the offset as the Gluon kernels build them per row (base + offset x step, no carries).
_ROUTE_WORD_TO_E4M3_PTX = tl.constexpr(
    "{\n.reg .b32 m, t, o, lo, hi;\nand.b32 o, $3, 0xFF;\n"
    f"mad.lo.u32 lo, o, {LUT_LO_STEP:#x}, {LUT_LO_BASE:#x};\nmad.lo.u32 hi, o, {LUT_HI_STEP:#x}, {LUT_HI_BASE:#x};"
    + E2M1_TO_E4M3_PTX_BODY.replace("WORD", "$2").replace("LO", "lo").replace("HI", "hi") + "}\n")


@triton.jit
def _e4m3_byte(magnitude, sign, base):
    """The e4m3 byte of e2m1 magnitude code 0..7 (values 0, .5, 1, 1.5, 2, 3, 4, 6) times 2^d, with base = (d + 6) << 3
    (code 1 = 2^(d-1): exponent field d + 6; code c >= 2: field (c >> 1) + d + 6 and mantissa (c & 1) << 2, i.e. the
    byte c << 2 on top of base), and the sign bit."""
    byte = tl.where(magnitude >= 2, (magnitude << 2) + base, tl.where(magnitude == 1, base, 0))
    return byte | (sign << 7)


@triton.jit
def route_bytes_to_e4m3(packed, offsets, ASM: tl.constexpr):
    """packed: uint8 [R, 64], one K step of R weight rows in the route's order (16 words); offsets: uint8 [R, 64],
    each byte's 32-block offset (d + 5) -> (first, second) uint8 [R, 64] e4m3 bytes: byte 4w + j of the first is
    value j of word w (k = 32c + 4q + j for w = 4c + q), of the second value 4 + j (k + 16). ASM: the inline PTX
    (CUDA); else integer ops giving the same bytes (the interpreter)."""
    if ASM:
        first, second = tl.inline_asm_elementwise(_ROUTE_WORD_TO_E4M3_PTX, "=r,=r,r,r", [packed, offsets],
                                                  dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        R: tl.constexpr = packed.shape[0]
        b02, b13 = tl.split(tl.reshape(packed.to(tl.int32), [R, 16, 2, 2]))  # a word's bytes (0, 2) and (1, 3)
        b0, b2 = tl.split(b02)
        b1, b3 = tl.split(b13)
        base = (tl.max(tl.reshape(offsets.to(tl.int32), [R, 16, 4]), axis=2) + 1) << 3
        # value i's magnitude: byte i // 2, nibble i % 2; sign of value j < 4: bit 7 of byte j, of 4 + j: its bit 3
        v0 = _e4m3_byte(b0 & 7, b0 >> 7, base)
        v1 = _e4m3_byte((b0 >> 4) & 7, b1 >> 7, base)
        v2 = _e4m3_byte(b1 & 7, b2 >> 7, base)
        v3 = _e4m3_byte((b1 >> 4) & 7, b3 >> 7, base)
        v4 = _e4m3_byte(b2 & 7, (b0 >> 3) & 1, base)
        v5 = _e4m3_byte((b2 >> 4) & 7, (b1 >> 3) & 1, base)
        v6 = _e4m3_byte(b3 & 7, (b2 >> 3) & 1, base)
        v7 = _e4m3_byte((b3 >> 4) & 7, (b3 >> 3) & 1, base)
        # join(join(a, c), join(b, d)) lays a, b, c, d out in that order along the last dim
        first = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [R, 64]).to(tl.uint8)
        second = tl.reshape(tl.join(tl.join(v4, v6), tl.join(v5, v7)), [R, 64]).to(tl.uint8)
    return first, second


@triton.jit
def fp4_e4m3_gemm_kernel(
    x_ptr, sx_ptr, w_ptr, offsets_ptr, column_scales_ptr, d_ptr, group_ptr,
    M, N, K,
    stride_x_g, stride_x, stride_sx_g, stride_sx, stride_w, stride_d_g, stride_d,
    LAYOUT: tl.constexpr,  # LAYOUT_CONTIGUOUS or LAYOUT_MASKED (gemm_kernel)
    ASM: tl.constexpr,  # the conversion in inline PTX (CUDA), else in integer ops (route_bytes_to_e4m3)
    BLOCK_N: tl.constexpr,  # weight rows per tile
    BLOCK_M: tl.constexpr,  # tokens per tile
    GROUP_M: tl.constexpr,
):
    """d[m, n] = column_scales[g, n] * sum over K steps s of sx[m, s] * sum_k x[m, k] * w'[n, k], w' the e4m3 weights
    of the route's words w [G, N, K / 2] under the offsets [G, N, K / 128] (int32 words of 4 offset bytes). x: e4m3
    [M, K] (masked: [G, M, K]), sx: fp32 [M, K / 128] (masked: [G, M, K / 128]); d: bf16, rows that are padding
    (contiguous -1) or past a group's count (masked) are not written. Weight tables are contiguous (gemm checks);
    stride_w = K / 2, passed so that Triton sees its 16-byte divisibility (16-byte copies of the weight rows).
    The tile is computed transposed (D^T = W X^T): the converted weights are the MMA's left operand, which Triton
    takes from registers, and the tokens its N, so token tiles may be smaller than wgmma's 64 rows."""
    offs_m, offs_n, skip, row_ok, weight_group, token_group = program_tile(group_ptr, M, N, LAYOUT, BLOCK_M, BLOCK_N,
                                                                            GROUP_M)
    if skip:
        return
    rows = (offs_m % M).to(tl.int64)
    weight_rows = weight_group * N + (offs_n % N).to(tl.int64)  # rows of the [G * N, ...] weight tables
    j = tl.arange(0, 64)
    k_first = 32 * (j // 16) + j % 16  # the K position of byte j of a step's first e4m3 tile; the second's is + 16
    x_ptrs = x_ptr + token_group * stride_x_g + rows[:, None] * stride_x + k_first[None, :]
    sx_ptrs = sx_ptr + token_group * stride_sx_g + rows * stride_sx
    w_ptrs = w_ptr + weight_rows[:, None] * stride_w + j[None, :]
    offset_words = offsets_ptr + weight_rows * (K // 128)
    offset_shift = (8 * (j // 16))[None, :]  # byte j of a step belongs to 32-block j // 16
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(0, K // 128):
        offsets = ((tl.load(offset_words + step)[:, None] >> offset_shift) & 0xFF).to(tl.uint8)
        w_first, w_second = route_bytes_to_e4m3(tl.load(w_ptrs + 64 * step), offsets, ASM)
        w_first = w_first.to(tl.float8e4nv, bitcast=True)
        w_second = w_second.to(tl.float8e4nv, bitcast=True)
        x_first = tl.load(x_ptrs + 128 * step)
        x_second = tl.load(x_ptrs + 128 * step + 16)
        sx = tl.load(sx_ptrs + step)
        part = tl.dot(w_second, tl.trans(x_second), tl.dot(w_first, tl.trans(x_first)))
        acc += part * sx[None, :]
    column_scales = tl.load(column_scales_ptr + weight_rows)
    out_ok = row_ok[:, None] & (offs_n < N)[None, :]
    out_ptrs = d_ptr + token_group * stride_d_g + offs_m.to(tl.int64)[:, None] * stride_d + offs_n[None, :]
    tl.store(tl.trans(out_ptrs), (acc * column_scales[:, None]).to(tl.bfloat16), mask=tl.trans(out_ok))
