"""RMSNorm in one Triton kernel: ops.rmsnorm (the reference) without its fp32 intermediates.

Why: ops.rmsnorm is six torch kernels (the fp32 copy, the square, the mean, rsqrt, two products) and a cast, each a
pass over an fp32 [T, D] tensor. At 4,096 tokens the two block norms (attn_norm, ffn_norm, D = 5,120) then move
~750 MB where 84 MB (one bf16 read, one bf16 write) would do, and the session-30 prefill profile charged the norms
23.5 ms of a 488.6 ms 40-layer step (docs/reports/runtime-rmsnorm-fused.md). Here each program holds BLOCK_R whole
rows in registers: one read of x, one write of y.

Numerics: the reference's formula in fp32, (x * rsqrt(mean(x^2) + eps)) * w, cast to x's dtype; only the order of
the sum of squares differs (a tree over the row here), so outputs agree to one rounding of the output dtype
(tests: runtime/tests/test_rmsnorm.py).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: ops.rmsnorm runs instead
    triton = None

MAX_D = 16384  # a row lives in one program's registers: 64 fp32 per thread at 8 warps
ROW_ELEMENTS = 4096  # elements a program covers at least (BLOCK_R rows of BLOCK_D), so short rows share programs

if triton is not None:

    @triton.jit
    def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, R, D, stride_x, stride_y, eps, BLOCK_R: tl.constexpr,
                       BLOCK_D: tl.constexpr):
        r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        m = (r < R)[:, None] & (d < D)[None, :]
        x = tl.load(x_ptr + r[:, None] * stride_x + d[None, :], mask=m, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + r[:, None] * stride_y + d[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


def available(x: torch.Tensor) -> bool:
    """Whether rmsnorm_fused applies: Triton importable, a float tensor on CUDA, rows of at most MAX_D."""
    return (triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and 0 < x.shape[-1] <= MAX_D)


def rmsnorm_fused(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """ops.rmsnorm, same arguments: x [..., D] (bf16, fp16 or fp32, on CUDA, D <= MAX_D), w [D] (any float dtype)
    -> y of x's shape and dtype, y = x * rsqrt(mean(x^2, -1) + eps) * w computed in fp32."""
    D = x.shape[-1]
    if w.shape != (D,):
        raise ValueError(f"rmsnorm_fused: weight of shape {tuple(w.shape)} for rows of {D}")
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    R = x2.shape[0]
    if R == 0:
        return y.view(x.shape)
    block_d = triton.next_power_of_2(D)
    block_r = max(1, ROW_ELEMENTS // block_d)
    # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
    # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
    rmsnorm_kernel[(triton.cdiv(R, block_r),)](
        x2, w.contiguous(), y, R, D, x2.stride(0), y.stride(0), eps, BLOCK_R=block_r, BLOCK_D=block_d,
        num_warps=8 if block_d >= 4096 else 4, enable_fp_fusion=True)
    return y.view(x.shape)
