"""Interleaved-pair RoPE in place, in one Triton kernel: ops.apply_rope_ (the reference) without its fp32 and
complex intermediates.

Why: ops.apply_rope_ is seven torch kernels per call (the positions cast, the angles, ones, torch.polar, an fp32 copy
of the rotated dims, the complex product, the copy back), and the engine calls it five times per layer (q,
the window kv, the indexer's queries and keys, the attention output's inverse). At 4,096 tokens q and the output
each move ~330 MB through fp32 temporaries where 67 MB (the rotated 64 of every head's 512 dims, read and written in
bf16) would do, and each call costs the host seven launches. Here a program rotates BLOCK_T tokens x all heads:
cos / sin once per token and frequency, one read and one write of the rotated dims.

Numerics: the reference's operations in fp32: angle = fp32(position) x freq, (cos, sin) by libdevice's cosf /
sinf (the CUDA math library functions torch.polar calls; tl.cos / tl.sin would be approximations), sin negated
for the inverse (the conjugate), then the complex product re = a cos - b sin, im = a sin + b cos, rounded once to
x's dtype. Whether each of those two sums is contracted into an FMA is the compiler's choice, in torch's kernel
as here, so a rotated value may differ from the reference in its last fp32 bit and, rarely, in its rounding to
bf16 (tests/test_rope.py: every value within one rounding of the output dtype, the equal fraction printed).
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice
except ImportError:  # CPU-only installs: ops.apply_rope_ runs instead
    triton = None

TILE_ELEMENTS = 4096  # rotated values a program covers at least (BLOCK_T tokens x BLOCK_H heads x rotated dims)

if triton is not None:

    @triton.jit
    def rope_kernel(x_ptr, pos_ptr, freq_ptr, T, H, stride_t, stride_h, offset, HALF: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, INVERSE: tl.constexpr, LIBDEVICE: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        h = tl.arange(0, BLOCK_H)
        pos = tl.load(pos_ptr + t, mask=t < T, other=0).to(tl.float32)
        angle = pos[:, None] * tl.load(freq_ptr + tl.arange(0, HALF))[None, :]  # [BLOCK_T, HALF]
        if LIBDEVICE:
            cos, sin = libdevice.cos(angle), libdevice.sin(angle)
        else:  # the interpreter cannot call libdevice
            cos, sin = tl.cos(angle), tl.sin(angle)
        if INVERSE:
            sin = -sin
        cols = tl.arange(0, 2 * HALF)
        ptr = (x_ptr + t.to(tl.int64)[:, None, None] * stride_t + h[None, :, None] * stride_h + offset
               + cols[None, None, :])
        m = (t < T)[:, None, None] & (h < H)[None, :, None]
        x = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_H, HALF, 2]))  # the pairs' even and odd members
        c, s = cos[:, None, :], sin[:, None, :]
        y = tl.reshape(tl.join(a * c - b * s, a * s + b * c), [BLOCK_T, BLOCK_H, 2 * HALF])
        tl.store(ptr, y.to(x_ptr.dtype.element_ty), mask=m)


def available(x: torch.Tensor, freqs: torch.Tensor) -> bool:
    """Whether rope_fused_ applies: Triton importable, a float x on CUDA whose last dim is contiguous and whose middle
    dims flatten to heads without a copy, a power-of-two count of frequencies."""
    half = freqs.shape[0]
    if not (triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and x.dim() >= 2 and x.stride(-1) == 1 and 0 < 2 * half <= x.shape[-1] and half & (half - 1) == 0):
        return False
    try:
        x.view(x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1])
    except RuntimeError:
        return False
    return True


def rope_fused_(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False
                ) -> torch.Tensor:
    """ops.apply_rope_, same arguments, in one kernel: x [T, ..., D] on CUDA (available(x, freqs)), its last
    2 * len(freqs) dims rotated in place as interleaved pairs (2i, 2i + 1) by positions int [T] x freqs fp32 [D_rot/2]
    (conjugated with inverse). Returns x."""
    T, D, half = x.shape[0], x.shape[-1], freqs.shape[0]
    if positions.shape != (T,):
        raise ValueError(f"rope_fused_: positions of shape {tuple(positions.shape)} for {T} tokens")
    x3 = x.view(T, math.prod(x.shape[1:-1]), D)  # heads flattened (-1 cannot infer them when T is 0)
    if T == 0 or x3.shape[1] == 0:
        return x
    block_h = triton.next_power_of_2(x3.shape[1])
    block_t = max(1, TILE_ELEMENTS // (block_h * 2 * half))
    # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
    # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
    rope_kernel[(triton.cdiv(T, block_t),)](
        x3, positions.contiguous(), freqs.float().contiguous(), T, x3.shape[1], x3.stride(0), x3.stride(1),
        D - 2 * half, HALF=half, BLOCK_T=block_t, BLOCK_H=block_h, INVERSE=inverse, LIBDEVICE=x.is_cuda,
        enable_fp_fusion=True)
    return x
