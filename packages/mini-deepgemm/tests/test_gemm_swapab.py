"""The swap-AB kernel's two exact conversions, bit for bit against the references: the FP4 -> bf16 conversion with
the scale folded into the exponent, and the activation pass (gemm._dequant_activations: FP8 x UE8M0 -> bf16,
natural or FP4 K order).

The GEMM itself is tested in test_gemm.py (strategy `swap_ab`, GPU only: the interpreter computes bf16 tl.dot on
raw bits). These conversions have no dot, so they also run on CPU under TRITON_INTERPRET=1, which CI does through
the subprocess test at the end.
"""

import os
import subprocess
import sys

import pytest
import torch

from mini_deepgemm import reference
from mini_deepgemm.testing import random_bf16

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402  (after the importorskip)

from mini_deepgemm import gemm  # noqa: E402
from mini_deepgemm.gemm_swapab_kernel import fp4_bytes_to_bf16, fp4_to_bf16_scaled  # noqa: E402

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


@pytest.mark.skipif(torch.cuda.is_available() or INTERPRET, reason="CUDA runs the kernels directly")
def test_conversions_run_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's conversion tests once under TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "7 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
