"""Pure-torch reference quantizers of DeepSeek-V4.1 (the oracles every kernel is tested against).

Semantics follow the official kernel.py as described in V41_MODEL.md section 3; all of them are bit-exact
functions of their input, run on CPU or GPU, and are the CPU fallback of the package.

Formats
- UE8M0 scale: one byte e, value 2^(e-127); stored as torch.float8_e8m0fnu or uint8.
- FP8 activations (`act_quant`): per row, per `block` columns, s = 2^ceil(log2(amax/448)), q = e4m3(x/s).
- FP8 weights (`weight_quant_fp8`): per block x block tile, same power-of-two rule.
- FP4 e2m1 (`fp4_quant`): code table [0, .5, 1, 1.5, 2, 3, 4, 6], bit 3 = sign; packed two per byte along the
  last dim, low nibble = even column. Scale either UE8M0 (power of two) or e4m3.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Thresholds of round-half-to-even onto the e2m1 grid (kernel.py's comparison chain); ">=" where the tie
# rounds up to an even code, ">" where it rounds down.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _blocked(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quant block {block}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def pow2_ceil_exponent(v: torch.Tensor) -> torch.Tensor:
    """Biased exponent e (int32) with 2^(e-127) = 2^ceil(log2(v)) for fp32 v > 0, by the bit trick
    (exponent + (mantissa != 0)), clamped to [0, 254] like the reference."""
    bits = v.float().contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return exp.clamp(0, 254)


def ue8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale (float8_e8m0fnu or uint8 biased exponent) -> fp32 power of two."""
    if e.dtype == torch.float8_e8m0fnu:
        e = e.view(torch.uint8)
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e.to(torch.int32) - 127)


def exponent_to_ue8m0(e: torch.Tensor) -> torch.Tensor:
    return e.to(torch.uint8).view(torch.float8_e8m0fnu)


# --------------------------------------------------------------------------- FP8
def act_quant(x: torch.Tensor, block: int = 32, scale_fmt: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-`block`-column FP8 quantization of activations.

    x: [..., K] (any float dtype). Returns (q e4m3 [..., K], scale [..., K/block]) where scale is
    float8_e8m0fnu for scale_fmt="ue8m0" (power of two, V4.1) or fp32 amax/448 for scale_fmt="fp32" (V3 recipe).
    """
    xb = _blocked(x.float(), block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    if scale_fmt == "ue8m0":
        e = pow2_ceil_exponent(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
        s = ue8m0_to_float(e)
        scale_out = exponent_to_ue8m0(e.squeeze(-1))
    elif scale_fmt == "fp32":
        s = amax / FP8_MAX
        scale_out = s.squeeze(-1)
    else:
        raise ValueError(f"unknown scale_fmt {scale_fmt!r} (expected 'ue8m0' or 'fp32')")
    q = (xb / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), scale_out


def scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return ue8m0_to_float(scale)
    return scale.float()


def act_dequant(q: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Inverse of `act_quant`, fp32 [..., K]."""
    s = scale_to_float(scale).unsqueeze(-1)
    return (_blocked(q.float(), block) * s).reshape(q.shape)


def fp8_fakequant(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """act_quant(inplace=True): quantize to FP8 with UE8M0 per `block` and dequantize back to x.dtype."""
    q, s = act_quant(x, block, "ue8m0")
    return act_dequant(q, s, block).to(x.dtype)


def weight_quant_fp8(w: torch.Tensor, block: int = 32, scale_fmt: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """Block x block FP8 weight quantization. w: [N, K] -> (e4m3 [N, K], scale [N/block, K/block])."""
    N, K = w.shape
    if N % block or K % block:
        raise ValueError(f"weight shape {tuple(w.shape)} is not a multiple of the block {block}")
    wb = w.float().reshape(N // block, block, K // block, block)
    amax = wb.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-4)
    if scale_fmt == "ue8m0":
        e = pow2_ceil_exponent(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
        s = ue8m0_to_float(e)
        scale_out = exponent_to_ue8m0(e.reshape(N // block, K // block))
    elif scale_fmt == "fp32":
        s = amax / FP8_MAX
        scale_out = s.reshape(N // block, K // block)
    else:
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}")
    q = (wb / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(N, K)
    return q, scale_out


def weight_dequant_fp8(q: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """[N, K] e4m3 with [ceil(N/block), ceil(K/block)] scales -> fp32 [N, K]."""
    s = scale_to_float(scale)
    s = s.repeat_interleave(block, 0)[: q.shape[0]].repeat_interleave(block, 1)[:, : q.shape[1]]
    return q.float() * s


def fold_ue8m0_to_128(q: torch.Tensor, scale: torch.Tensor, gran_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A V4.1 FP8 operand in the V3 recipe's form: one power-of-two fp32 scale per 1 x 128 (activations) or
    128 x 128 (weights) block instead of UE8M0 per 1 x 32 or 32 x 32.

    q e4m3 [R, K] with scale UE8M0 [R / gran_rows, K / 32], gran_rows 1 (activations, also [..., K] with scale
    [..., K / 32]) or 32 (weights; R % 128 == 0); K % 128 == 0. Each output block takes its largest exponent e_max
    (2^(e_max - 127), fp32 [R, K / 128] or [R / 128, K / 128]) and every value is re-expressed under it:
    q' = e4m3(q x 2^(e - e_max)), rounded to nearest even, where e is the value's own 32-block exponent. Exact
    unless the shift takes a value below e4m3's smallest normal 2^-6, i.e. a value under 2^(e_max - e - 6) in its
    group's units (whose largest is >= 224): that rounds to the subnormal grid 2^-9, an error of at most
    2^-10 x 2^(e_max - 127) (docs/reports/deepgemm-v41-fold.md)."""
    if gran_rows not in (1, 32):
        raise ValueError(f"gran_rows must be 1 (activations) or 32 (weights), got {gran_rows}")
    if gran_rows == 1 and q.dim() != 2:  # activations of any leading shape: row by row
        K = q.shape[-1]
        if scale.shape[:-1] != q.shape[:-1]:
            raise ValueError(f"scale {tuple(scale.shape)} does not match q {tuple(q.shape)} row for row")
        folded, folded_scale = fold_ue8m0_to_128(q.reshape(-1, K), scale.reshape(-1, scale.shape[-1]), 1)
        return folded.view(q.shape), folded_scale.view(*q.shape[:-1], K // 128)
    R, K = q.shape
    out_rows = 1 if gran_rows == 1 else 128
    if K % 128 or R % out_rows or tuple(scale.shape) != (R // gran_rows, K // 32):
        raise ValueError(f"need K % 128 == 0, R % {out_rows} == 0 and scale [{R // gran_rows}, {K // 32}], got q "
                         f"{tuple(q.shape)}, scale {tuple(scale.shape)}")
    e = (scale.view(torch.uint8) if scale.dtype == torch.float8_e8m0fnu else scale).to(torch.int32)
    per = out_rows // gran_rows  # scale rows per output block: 1 or 4
    blocks = e.view(R // out_rows, per, K // 128, 4)
    e_max = blocks.amax(dim=(1, 3))
    shift = (e_max[:, None, :, None] - blocks).reshape(R // gran_rows, K // 32)
    factor = torch.ldexp(torch.ones_like(shift, dtype=torch.float32), -shift.to(torch.float32))
    # broadcast over each scale block rather than expanded to [R, K]: one fp32 copy of q at load, not two
    blocked = q.float().view(R // gran_rows, gran_rows, K // 32, 32) * factor[:, None, :, None]
    folded = blocked.to(torch.float8_e4m3fn).view(R, K)
    return folded, torch.ldexp(torch.ones_like(e_max, dtype=torch.float32), (e_max - 127).to(torch.float32))


def ue8m0_from_fold_128(scale: torch.Tensor) -> torch.Tensor:
    """Scales folded per 128 columns (fold_ue8m0_to_128's fp32 powers of two [..., K / 128]) as UE8M0 per 32
    columns (float8_e8m0fnu [..., K / 32], each exponent repeated 4 times): the same values, for kernels that read
    per-32 scales. Reads the exponent field only: scale must be a normal power of two."""
    exponent = (scale.contiguous().view(torch.int32) >> 23) & 0xFF
    return exponent.to(torch.uint8).repeat_interleave(4, dim=-1).view(torch.float8_e8m0fnu)


# --------------------------------------------------------------------------- FP4 (e2m1)
def e2m1_code(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Magnitude code 0..7 of a = |x| on the grid s * e2m1 (round half to even, saturating at 6).
    Compares a with t * s (exact in fp32 for both scale formats), as the reference does."""
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t, inclusive in _E2M1_THRESHOLDS:
        code += (a >= t * s if inclusive else a > t * s).to(torch.uint8)
    return code


def fp4_quant(x: torch.Tensor, block: int = 32, scale_fmt: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 e2m1 quantization (kernel.py's fp4_act_quant), packed two per byte along the last dim.

    x: [..., K]. scale_fmt "ue8m0": s = 2^ceil(log2(amax/6)), amax >= 6*2^-126 (indexer q/k, expert weights);
    "e4m3": s = e4m3(max(amax, 6*2^-9) / 6) (compressed main KV, block 16).
    Returns (packed uint8 [..., K/2], scale [..., K/block] as float8_e8m0fnu or float8_e4m3fn).
    """
    xf = x.float()
    xb = _blocked(xf, block)
    amax = xb.abs().amax(-1, keepdim=True)
    if scale_fmt == "ue8m0":
        amax = amax.clamp_min(FP4_MAX * 2.0**-126)
        e = pow2_ceil_exponent(amax * torch.tensor(1.0 / FP4_MAX, dtype=torch.float32))
        s = ue8m0_to_float(e)
        scale_out = exponent_to_ue8m0(e.squeeze(-1))
    elif scale_fmt == "e4m3":
        s8 = (amax.clamp_min(FP4_MAX * 2.0**-9) / FP4_MAX).to(torch.float8_e4m3fn)
        s = s8.float()
        scale_out = s8.squeeze(-1)
    else:
        raise ValueError(f"unknown scale_fmt {scale_fmt!r} (expected 'ue8m0' or 'e4m3')")
    code = e2m1_code(xb.abs(), s)
    sign = (xb < 0).to(torch.uint8) << 3
    nib = (code | sign).reshape(x.shape)
    return pack_fp4(nib), scale_out


def pack_fp4(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 nibbles -> [..., K/2] bytes, low nibble = even column."""
    if nibbles.shape[-1] % 2:
        raise ValueError("FP4 packing needs an even last dim")
    n = nibbles.to(torch.uint8)
    return n[..., 0::2] | (n[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes (uint8 or int8) -> fp32 e2m1 values [..., K] (without scale)."""
    p = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    nib = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)
    # E2M1_VALUES[c] = 0.5 * m for exponent field e = 0, else 2^(e-1) * (1 + m / 2) (e = c >> 1, m = c & 1):
    # computed, not looked up in a table copied from the host, so a CUDA forward (or graph capture) never syncs
    e = (nib >> 1) & 3
    m = (nib & 1).float()
    mag = torch.where(e == 0, 0.5 * m, torch.ldexp(1 + 0.5 * m, e.to(torch.int32) - 1))
    return torch.where((nib & 8) != 0, -mag, mag)


# --------------------------------------------------------------------------- the FP8-MMA route's weight order
# Bit of a route-order word that holds the sign of its value i (a checkpoint word holds it in bit 4i + 3)
_FP8_MMA_SIGN_BITS = (7, 15, 23, 31, 3, 11, 19, 27)
# Bytes of rows per pass of the order's conversions: few launches on an expert stack (GBs at load), int32
# temporaries of a few times this
_ORDER_CHUNK_BYTES = 128 << 20


def fp4_to_fp8_mma_order(packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed e2m1 weights uint8 or int8 [..., K/2] (low nibble = even k, K % 128 == 0) -> the same values in the order
    mini-deepgemm's FP8-MMA MoE kernels read (gemm_gluon_fp4_e4m3_kernel; docs/reports/deepgemm-moe-fold-128.md, session
    45). Per 128 values of K (64 bytes, one K step), 32-bit word 4c + q (c, q in 0..3) holds values 32c + 4q .. + 3 in
    its low half and 32c + 16 + 4q .. + 3 in its high half: a wgmma A-fragment thread's 8 values of k32 chunk c, so that
    thread loads each word whole, and a 16-byte chunk is one k32 chunk's values. Within a word, value i keeps its
    magnitude in bits 4i .. 4i + 2 and its sign moves to bit _FP8_MMA_SIGN_BITS[i], where the e4m3 conversion wants it
    (7 instructions per word instead of 9). Written into out (a contiguous tensor like packed; packed itself reorders
    in place; None: a new one), rows in chunks of _ORDER_CHUNK_BYTES. fp4_from_fp8_mma_order inverts it bit for
    bit."""
    return _by_row_chunks(_rows_to_fp8_mma_order, packed, out)


def fp4_from_fp8_mma_order(packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The checkpoint's order of weights given in fp4_to_fp8_mma_order's ([..., K/2]), into out as there."""
    return _by_row_chunks(_rows_from_fp8_mma_order, packed, out)


def _by_row_chunks(convert, packed: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """out[rows] = convert(packed[rows]) over packed's rows [R, K/2], _ORDER_CHUNK_BYTES at a time."""
    if out is None:
        out = torch.empty_like(packed, memory_format=torch.contiguous_format)
    if out.shape != packed.shape or out.dtype != packed.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {packed.dtype} {tuple(packed.shape)}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    rows, dst = packed.reshape(-1, packed.shape[-1]), out.view(-1, packed.shape[-1])
    step = max(1, _ORDER_CHUNK_BYTES // max(1, rows.shape[1]))
    for r in range(0, rows.shape[0], step):
        dst[r:r + step] = convert(rows[r:r + step].contiguous().view(torch.uint8)).view(packed.dtype)
    return out


def _rows_to_fp8_mma_order(rows: torch.Tensor) -> torch.Tensor:
    """fp4_to_fp8_mma_order of uint8 rows [R, K/2], a new tensor."""
    pieces = rows.view(torch.int16).view(rows.shape[0], -1, 4, 2, 4)  # (row, step, c, s, q): 2-byte piece 8c + 4s + q
    words = pieces.permute(0, 1, 2, 4, 3).contiguous().view(torch.int32)  # word (c, q)
    out = words & 0x77777777
    for i, bit in enumerate(_FP8_MMA_SIGN_BITS):
        out |= ((words >> (4 * i + 3)) & 1) << bit
    return out.view(torch.uint8).view(rows.shape)


def _rows_from_fp8_mma_order(rows: torch.Tensor) -> torch.Tensor:
    """fp4_from_fp8_mma_order of uint8 rows [R, K/2], a new tensor."""
    words = rows.view(torch.int32)
    natural = words & 0x77777777
    for i, bit in enumerate(_FP8_MMA_SIGN_BITS):
        natural |= ((words >> bit) & 1) << (4 * i + 3)
    pieces = natural.view(torch.int16).view(rows.shape[0], -1, 4, 4, 2)  # (row, step, c, q, s)
    return pieces.permute(0, 1, 2, 4, 3).contiguous().view(torch.uint8).view(rows.shape)


def fp4_dequant(packed: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Inverse of `fp4_quant`: fp32 [..., K]."""
    v = unpack_fp4(packed)
    s = scale_to_float(scale).unsqueeze(-1)
    return (_blocked(v, block) * s).reshape(v.shape)


def fp4_fakequant(x: torch.Tensor, block: int = 32, scale_fmt: str = "ue8m0") -> torch.Tensor:
    """Quantize to FP4 and dequantize back to x.dtype (exact in bf16)."""
    q, s = fp4_quant(x, block, scale_fmt)
    return fp4_dequant(q, s, block).to(x.dtype)


# --------------------------------------------------------------------------- reference linears
def fp8_linear_ref(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """V4.1 FP8 linear: activation quantized per token per `block`, weight e4m3 with per-block x block scales,
    fp32 accumulation, output in bf16. x: [..., K], w: [N, K]."""
    q, s = act_quant(x, block, "ue8m0")
    xa = act_dequant(q, s, block)
    wd = weight_dequant_fp8(w, w_scale, block)
    return (xa.reshape(-1, x.shape[-1]) @ wd.T).reshape(*x.shape[:-1], w.shape[0]).to(torch.bfloat16)


def fp4_linear_ref(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """V4.1 FP4-weight linear (routed experts): FP8 activation quant per 32, e2m1 weight x UE8M0 per 32 along K,
    fp32 accumulation, bf16 output. x: [..., K], w_packed: [N, K/2]."""
    q, s = act_quant(x, block, "ue8m0")
    xa = act_dequant(q, s, block)
    wd = fp4_dequant(w_packed, w_scale, block)
    return (xa.reshape(-1, x.shape[-1]) @ wd.T).reshape(*x.shape[:-1], w_packed.shape[0]).to(torch.bfloat16)


# --------------------------------------------------------------------------- GEMM references (NT: B is [N, K])
def dequant_operand(q: torch.Tensor, scale: torch.Tensor, gran_rows: int, gran_k: int) -> torch.Tensor:
    """Dequantize one GEMM operand to fp32 [R, K].

    q: e4m3 [R, K], or packed e2m1 [R, K/2] (uint8/int8, low nibble = even k).
    scale: [ceil(R/gran_rows), K/gran_k], UE8M0 (float8_e8m0fnu/uint8) or fp32; one scale per
    gran_rows x gran_k block (activations: gran_rows=1; V4.1 FP8 weights: 32; V3: 128; FP4 weights: 1).
    """
    v = unpack_fp4(q) if q.dtype in (torch.uint8, torch.int8) else q.float()
    s = scale_to_float(scale)
    s = s.repeat_interleave(gran_rows, 0)[: v.shape[0]].repeat_interleave(gran_k, 1)[:, : v.shape[1]]
    return v * s


def gemm_nt_ref(
    a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, b_gran_n: int, gran_k: int
) -> torch.Tensor:
    """D = dequant(A) @ dequant(B)^T in fp32 [M, N]: A [M, K] e4m3 with per-row, per-gran_k scales; B [N, K]
    e4m3 (or packed e2m1 [N, K/2]) with per b_gran_n x gran_k scales. Every product is exact in fp32, so
    a kernel differs from this only by the order of the fp32 additions."""
    return dequant_operand(a, sa, 1, gran_k) @ dequant_operand(b, sb, b_gran_n, gran_k).T


def m_grouped_gemm_nt_contiguous_ref(
    a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, grouped_layout: torch.Tensor,
    b_gran_n: int, gran_k: int,
) -> torch.Tensor:
    """Contiguous grouped GEMM: row m of A is multiplied by B[grouped_layout[m]]; fp32 [M, N], rows whose
    group id is -1 (padding) are 0."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for g in torch.unique(grouped_layout).tolist():
        if g < 0:
            continue
        rows = (grouped_layout == g).nonzero().squeeze(1)
        out[rows] = gemm_nt_ref(a[rows], sa[rows], b[g], sb[g], b_gran_n, gran_k)
    return out


def m_grouped_gemm_nt_masked_ref(
    a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, masked_m: torch.Tensor,
    b_gran_n: int, gran_k: int,
) -> torch.Tensor:
    """Masked grouped GEMM: A [G, max_m, K]; group g uses its first masked_m[g] rows. fp32 [G, max_m, N],
    rows past masked_m[g] are 0."""
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[1], dtype=torch.float32, device=a.device)
    for g, m in enumerate(masked_m.tolist()):
        if m > 0:
            out[g, :m] = gemm_nt_ref(a[g, :m], sa[g, :m], b[g], sb[g], b_gran_n, gran_k)
    return out
