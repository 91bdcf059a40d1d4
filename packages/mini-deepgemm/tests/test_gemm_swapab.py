"""The swap-AB kernel's two exact conversions, bit for bit against the references: the FP4 -> bf16 conversion with
the scale folded into the exponent, and the activation pass (gemm._dequant_activations: FP8 x UE8M0 -> bf16,
natural or FP4 K order); and the UE8M0 -> fp32 scale conversion that feeds the V4.1 Gluon kernel's scales-in-ring
(gemm._f32_scales_transposed). The bf16 route's FP4 PTX (this kernel's nibble blocks, the Gluon kernels' pair
blocks) is also interpreted on the CPU (testing.run_inline_ptx), so its text is checked on every CI run.

The GEMM itself is tested in test_gemm.py (strategy `swap_ab`, GPU only: the interpreter computes bf16 tl.dot on
raw bits). These conversions have no dot, so they also run on CPU under TRITON_INTERPRET=1, which CI does through
the subprocess test at the end.
"""

import os

import pytest
import torch

from mini_deepgemm import reference
from mini_deepgemm.testing import (bf16_bits, bf16_halves, contiguous_layout, random_bf16, random_fp4_weights,
                                   random_fp8_weights, run_inline_ptx, run_interpreted)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402  (after the importorskip)

from mini_deepgemm import gemm  # noqa: E402
from mini_deepgemm._backend import cdiv  # noqa: E402
from mini_deepgemm.gemm_swapab_kernel import (_FP4_HIGH_NIBBLE_PTX, _FP4_LOW_NIBBLE_PTX, LAYOUT_ROWS,  # noqa: E402
                                              MASKED_ROWS, dequant_act_kernel, fp4_bytes_to_bf16, fp4_to_bf16_scaled)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_a_runner = pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="needs CUDA or TRITON_INTERPRET=1")


@triton.jit
def fp4_codes_kernel(code_ptr, exp_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    e = tl.load(exp_ptr + i).to(tl.int32)
    tl.store(out_ptr + i, fp4_to_bf16_scaled(tl.load(code_ptr + i).to(tl.int32), (e - 1) << 7))


@needs_a_runner
def test_fp4_to_bf16_scaled_is_exact_for_every_code_and_scale():
    exps = torch.tensor([1, 2, 30, 60, 100, 120, 125, 126, 127, 128, 129, 134, 150, 200, 250, 252], dtype=torch.uint8)
    codes = torch.arange(16, dtype=torch.uint8).repeat(len(exps))
    e = exps.repeat_interleave(16)
    out = torch.empty(codes.numel(), dtype=torch.bfloat16, device=DEVICE)
    fp4_codes_kernel[(1,)](codes.to(DEVICE), e.to(DEVICE), out, N=codes.numel())
    # the reference's layout: one scale per 32 values, so each (code, exponent) pair gets a 32-value row of its own
    rows = torch.zeros(codes.numel(), 32, dtype=torch.uint8)
    rows[:, 0] = codes
    packed = rows[:, 0::2] | (rows[:, 1::2] << 4)  # low nibble = even index
    want = reference.fp4_dequant(packed, e.view(-1, 1).view(torch.float8_e8m0fnu))[:, 0]
    assert torch.equal(out.cpu().float(), want.float()), (out.cpu()[:32], want[:32])


@triton.jit
def fp4_bytes_kernel(byte_ptr, exp_ptr, lo_ptr, hi_ptr, ROWS: tl.constexpr):
    r = tl.arange(0, ROWS)[:, None]
    i = r * 256 + tl.arange(0, 256)[None, :]
    scale = (tl.load(exp_ptr + r).to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
    lo, hi = fp4_bytes_to_bf16(tl.load(byte_ptr + i), scale)
    tl.store(lo_ptr + i, lo)
    tl.store(hi_ptr + i, hi)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX: CUDA only")
def test_fp4_bytes_to_bf16_ptx_is_exact_for_every_byte_and_scale():
    """The FP4_ASM path's conversion: all 256 bytes (both nibbles) at 16 exponents, the subnormal-producing
    e = 1 and the largest, 254, included, against the reference dequantization."""
    exps = torch.tensor([1, 2, 30, 60, 100, 120, 125, 126, 127, 128, 129, 134, 150, 200, 252, 254], dtype=torch.uint8)
    rows = len(exps)
    byte = torch.arange(256, dtype=torch.uint8).repeat(rows, 1)
    lo = torch.empty(rows, 256, dtype=torch.bfloat16, device="cuda")
    hi = torch.empty_like(lo)
    fp4_bytes_kernel[(1,)](byte.cuda(), exps.cuda(), lo, hi, ROWS=rows)
    # the reference: each byte as the first of a 16-byte (32-value) row with the row's exponent
    packed = torch.zeros(rows * 256, 16, dtype=torch.uint8)
    packed[:, 0] = byte.flatten()
    want = reference.fp4_dequant(packed, exps.repeat_interleave(256).view(-1, 1).view(torch.float8_e8m0fnu))
    assert torch.equal(lo.cpu().flatten().float(), want[:, 0].float())
    assert torch.equal(hi.cpu().flatten().float(), want[:, 1].float())


def test_fp4_nibble_ptx_interpreted_is_exact_for_every_byte():
    """The FP4_ASM path's PTX text (_FP4_LOW_NIBBLE_PTX, _FP4_HIGH_NIBBLE_PTX), interpreted on the CPU
    (testing.run_inline_ptx): every byte at each of a word's four positions gives its low / high nibble's e2m1 value
    as bf16 bits. The GPU test above runs the compiled kernel; this one checks the PTX text on every CI run."""
    values = reference.unpack_fp4(torch.arange(256, dtype=torch.uint8)[:, None])  # [256, 2]: low, high nibble
    g = torch.Generator().manual_seed(3)
    for nibble, ptx in enumerate((_FP4_LOW_NIBBLE_PTX.value, _FP4_HIGH_NIBBLE_PTX.value)):
        want = bf16_bits(values[:, nibble])
        for byte in range(256):
            for pos in range(4):
                word = int(torch.randint(0, 2**32, (1,), generator=g)) & ~(0xFF << 8 * pos) | byte << 8 * pos
                assert bf16_halves(run_inline_ptx(ptx, [word], 2))[pos] == want[byte], (nibble, byte, pos)


def test_pair_ptx_interpreted_is_exact_for_every_byte_and_scale():
    """gemm_gluon_kernel's _PAIR_PTX and _PAIR_FOLDED_PTX (the bf16 route's Gluon kernels), interpreted on the CPU:
    every byte in both positions of a pair, under UE8M0 scales from the subnormal-producing 1 to 254 (the folded form
    to 128, its stated bound), give the even and odd values times the scale as bf16 bits (inf past bf16's range, as
    the multiply gives it)."""
    k = pytest.importorskip("mini_deepgemm.gemm_gluon_kernel")
    values = reference.unpack_fp4(torch.arange(256, dtype=torch.uint8)[:, None])
    for e in (1, 2, 60, 120, 127, 128, 129, 200, 254):
        for ptx, scale_bits in ((k._PAIR_PTX.value, e << 7), (k._PAIR_FOLDED_PTX.value, (e + 126) << 7)):
            if ptx == k._PAIR_FOLDED_PTX.value and e > 128:
                continue
            even, odd = (bf16_bits(values[:, i] * 2.0 ** (e - 127)) for i in (0, 1))
            for b0 in range(256):
                b1 = (7 * b0 + 3) % 256
                pair = scale_bits | scale_bits << 16
                got_even, got_odd = run_inline_ptx(ptx, [b0 | b1 << 8, pair, pair], 2)
                assert bf16_halves([got_even]) == [even[b0], even[b1]], (e, b0)
                assert bf16_halves([got_odd]) == [odd[b0], odd[b1]], (e, b0)


@needs_a_runner
@pytest.mark.parametrize("permute", [False, True], ids=["natural", "fp4-order"])
@pytest.mark.parametrize("M,K", [(37, 2304), (8, 512), (130, 128)])
def test_activation_pass_is_exact(M, K, permute):
    gen = torch.Generator().manual_seed(M + K)
    x = random_bf16(M, K, row_block=32, generator=gen)
    q, s = reference.act_quant(x, 32, "ue8m0")
    want = reference.act_dequant(q, s, 32).to(torch.bfloat16)
    if permute:  # each 64-block as [its 32 even columns | its 32 odd columns]
        blocks = want.view(M, K // 64, 32, 2)
        want = torch.cat([blocks[..., 0], blocks[..., 1]], dim=-1).view(M, K)
    out = gemm._dequant_activations(q.to(DEVICE), s.to(DEVICE).view(torch.uint8), permute)
    assert torch.equal(out.cpu(), want)


def padded_activations(layout, K, generator):
    """(q e4m3 [M, K], UE8M0 bytes [M, K/32]) for a contiguous layout, its padding rows holding the e4m3 NaN code
    and the NaN scale 255, so a kernel that let one of them reach a real row fails."""
    q, s = reference.act_quant(random_bf16(layout.numel(), K, generator=generator), 32, "ue8m0")
    q, s = q.view(torch.uint8), s.view(torch.uint8)
    q[layout < 0], s[layout < 0] = 0x7F, 255
    return q.view(torch.float8_e4m3fn), s


@needs_a_runner
@pytest.mark.parametrize("permute", [False, True], ids=["natural", "fp4-order"])
def test_activation_pass_skips_padding_rows(permute):
    """With a contiguous layout the pass writes every real row as it does without one, and no padding row.
    Groups of 3, 9, 16 (no padding) and 1 row at alignment 16, 5 rows cut so the last 8-row tile is partial;
    K = 4.5 tiles of 512."""
    layout = contiguous_layout([3, 9, 16, 1], 16)[:-5]
    q, s = padded_activations(layout, 2304, torch.Generator().manual_seed(11))
    q, s, layout = q.to(DEVICE), s.to(DEVICE), layout.to(DEVICE)
    M, K = q.shape
    real = layout >= 0
    every_row = gemm._dequant_activations(q, s, permute)
    assert torch.equal(gemm._dequant_activations(q, s, permute, grouped_layout=layout)[real], every_row[real])
    out = torch.full((M, K), 7.0, dtype=torch.bfloat16, device=DEVICE)
    dequant_act_kernel[(cdiv(M, 8), cdiv(K, 512))](q, s, out, layout, M, K, 1, q.stride(0), s.stride(0),
                                                   out.stride(0), PERMUTE_FP4=permute, ROW_FILTER=LAYOUT_ROWS.value,
                                                   BLOCK_M=8, BLOCK_K=512)
    assert torch.equal(out[real], every_row[real])
    assert bool((out[~real] == 7.0).all()), "padding rows must be left unwritten"


@needs_a_runner
@pytest.mark.parametrize("permute", [False, True], ids=["natural", "fp4-order"])
def test_activation_pass_writes_only_the_used_rows_of_masked_groups(permute):
    """The masked layout's pass (counts read on the device): every used row as the pass over all rows writes it, no
    row past a group's count. 5 groups of 13 rows (8-row programs straddle groups) using 0, 1, 13, 8 and 12 rows;
    K = 2.25 tiles of 512. Unused rows hold the NaN codes, so reading one would show."""
    gen = torch.Generator().manual_seed(13)
    G, rows_per_group, K = 5, 13, 1152
    counts = torch.tensor([0, 1, 13, 8, 12], dtype=torch.int32)
    used = (torch.arange(rows_per_group)[None, :] < counts[:, None]).flatten()
    q, s = padded_activations(torch.where(used, 0, -1), K, gen)
    q, s, counts, used = q.to(DEVICE), s.to(DEVICE), counts.to(DEVICE), used.to(DEVICE)
    every_row = gemm._dequant_activations(q, s, permute)
    out = torch.full((G * rows_per_group, K), 7.0, dtype=torch.bfloat16, device=DEVICE)
    dequant_act_kernel[(cdiv(G * rows_per_group, 8), cdiv(K, 512))](
        q, s, out, counts, G * rows_per_group, K, rows_per_group, q.stride(0), s.stride(0), out.stride(0),
        PERMUTE_FP4=permute, ROW_FILTER=MASKED_ROWS.value, BLOCK_M=8, BLOCK_K=512)
    assert torch.equal(out[used], every_row[used])
    assert bool((out[~used] == 7.0).all()), "rows past a group's count must be left unwritten"
    through_api = gemm._dequant_activations(q, s, permute, masked_m=(counts, rows_per_group))
    assert torch.equal(through_api[used], every_row[used])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GEMM's bf16 tl.dot: CUDA only")
@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "fp4"])
def test_contiguous_gemm_real_rows_ignore_the_padding_rows_of_x(fp4):
    """The contiguous swap-AB GEMM over the pass that skips padding rows (their bf16 rows unwritten) gives the real
    rows the bits of the same GEMM over every row dequantized, and of one whose padding rows of x are NaN or inf:
    an output row reads only its own row of x."""
    gen = torch.Generator().manual_seed(12)
    N, K = 256, 5120
    layout = contiguous_layout([3, 130, 64, 1], gemm.get_m_alignment_for_contiguous_layout())
    q, s = (t.cuda() for t in padded_activations(layout, K, gen))
    layout = layout.cuda()
    G, M = 4, layout.numel()
    if fp4:
        _, bq, sb = random_fp4_weights(G, N=N, K=K, device="cuda", generator=gen)
    else:
        _, bq, sb = random_fp8_weights(G, N=N, K=K, block=32, scale_fmt="ue8m0", device="cuda", generator=gen)
    cfg = gemm.default_config(gemm._CONTIGUOUS, M, 32, True, N, G, fp4)
    assert cfg["SWAP_AB"] and not cfg.get("X_FP8", False), "the call must take the activation pass"
    real = layout >= 0

    def swapab_over(x):
        d = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm._swapab_gemm(x, None, bq.view(torch.uint8) if fp4 else bq, sb.view(torch.uint8), d, gemm._CONTIGUOUS,
                          layout, fp4, cfg)
        return d

    every_row = gemm._dequant_activations(q, s, fp4)
    assert not bool(every_row[~real].isfinite().any())
    want = swapab_over(every_row.nan_to_num(0.0))
    poisoned = every_row.clone()
    poisoned[~real] = float("inf")
    poisoned[~real, ::3] = float("nan")
    d = torch.full((M, N), 7.0, dtype=torch.bfloat16, device="cuda")
    (gemm.m_grouped_fp8_fp4_gemm_nt_contiguous if fp4 else gemm.m_grouped_fp8_gemm_nt_contiguous)(
        (q, s.view(torch.float8_e8m0fnu)), (bq, sb), d, layout)
    for got in (swapab_over(every_row), swapab_over(poisoned), d):
        assert torch.equal(got[real].view(torch.int16), want[real].view(torch.int16))
        assert bool((got[~real] == 7.0).all()), "padding rows of d must be left untouched"


@needs_a_runner
@pytest.mark.parametrize("R,C", [(1, 4), (100, 160), (257, 40)])
def test_v41_scales_to_fp32_transposed(R, C):
    """Every UE8M0 byte (0..255 cycled, 0 included: the subnormal 2^-127) becomes the fp32 2^(e - 127), transposed,
    bit for bit against torch.ldexp; the view's row stride is 16-byte aligned (rows padded to a multiple of 4)."""
    s = (torch.arange(R * C, dtype=torch.int64) * 37 % 256).to(torch.uint8).view(R, C)
    got = gemm._f32_scales_transposed(s.to(DEVICE))
    assert got.shape == (C, R) and got.stride(0) % 4 == 0
    want = torch.ldexp(torch.ones(R, C, dtype=torch.float64), s.to(torch.int64) - 127).to(torch.float32).t()
    assert torch.equal(got.cpu().view(torch.int32), want.contiguous().view(torch.int32))


@pytest.mark.skipif(torch.cuda.is_available() or INTERPRET, reason="CUDA runs the kernels directly")
def test_conversions_run_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's conversion tests once under TRITON_INTERPRET=1."""
    run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], timeout=600, expect="16 passed")
