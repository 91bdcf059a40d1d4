"""Activation and weight quantizers of the public API (bit-exact with reference.py).

FP8: `per_token_group_quant_fp8` and `per_token_group_fakequant_fp8` (the round trip of the window KV) run a Triton
kernel on GPU and reference.act_quant / fp8_fakequant elsewhere.
FP4 (e2m1): `per_token_group_quant_fp4` and `per_token_group_fakequant_fp4` (the quantize-dequantize round trip the
indexer's queries and keys (UE8M0 per 32) and the compressed KV (e4m3 per 16) take) run a Triton kernel on GPU,
bit-exact with reference.fp4_quant / fp4_fakequant run on CUDA, and the references elsewhere. `pack_fp4` and
`unpack_fp4` are the reference functions themselves.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import cdiv, use_triton
from .reference import pack_fp4, unpack_fp4

__all__ = ["per_token_group_quant_fp8", "per_token_group_fakequant_fp8", "per_token_group_quant_fp4",
           "per_token_group_fakequant_fp4", "pack_fp4", "unpack_fp4"]

_GROUPS_PER_PROGRAM = 16


def per_token_group_quant_fp8(
    x: torch.Tensor, group_size: int = 32, scale_fmt: str = "ue8m0", *, fold_128: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations to FP8 e4m3 per row and per `group_size` columns.

    x: [..., K] bf16/fp16/fp32, K % group_size == 0, last dim contiguous.
    scale_fmt "ue8m0" (V4.1, group 32): scale 2^ceil(log2(amax/448)) as float8_e8m0fnu;
    "fp32" (V3 recipe, group 128): scale amax/448 as fp32.
    Returns (q float8_e4m3fn [..., K], scale [..., K/group_size]) with row-major scales, the layout
    `fp8_gemm_nt` and the grouped GEMMs read. Bit-exact with reference.act_quant.
    fold_128 (group 32, "ue8m0", K % 128 == 0): V4.1's quantization in the V3 recipe's form, bit-exact with
    reference.fold_ue8m0_to_128 of reference.act_quant: q re-expressed under the largest scale of each 128
    columns, scale fp32 [..., K/128] (powers of two), the operand `fp8_gemm_nt` multiplies with weights from
    `gemm.fold_fp8_weight_scales` on its V3-recipe kernels.
    """
    if scale_fmt not in ("ue8m0", "fp32"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r} (expected 'ue8m0' or 'fp32')")
    K = x.shape[-1]
    _check_fp8_groups(K, group_size)
    if fold_128 and (group_size != 32 or scale_fmt != "ue8m0" or K % 128):
        raise ValueError(f"fold_128 folds V4.1's groups (group_size 32, 'ue8m0') four at a time: K % 128 == 0; got "
                         f"group_size {group_size}, scale_fmt {scale_fmt!r}, K {K}")
    if not use_triton(x) or x.numel() == 0:
        q, s = reference.act_quant(x, group_size, scale_fmt)
        if not fold_128:
            return q, s
        return reference.fold_ue8m0_to_128(q, s, 1)

    from .quant_kernel import act_quant_fp8_kernel

    x2 = _rows(x)
    M, num_groups = x2.shape[0], K // group_size
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    ue8m0 = scale_fmt == "ue8m0"
    num_scales = num_groups // 4 if fold_128 else num_groups
    s = torch.empty(M, num_scales, dtype=torch.uint8 if ue8m0 and not fold_128 else torch.float32, device=x.device)
    grid = (M, cdiv(num_groups, _GROUPS_PER_PROGRAM))
    # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
    # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
    act_quant_fp8_kernel[grid](
        x2, q, s, num_groups, x2.stride(0), q.stride(0), s.stride(0),
        GROUP=group_size, GROUPS_PER_PROGRAM=_GROUPS_PER_PROGRAM, UE8M0=ue8m0, FOLD_128=fold_128,
        enable_fp_fusion=True,
    )
    if s.dtype == torch.uint8:
        s = s.view(torch.float8_e8m0fnu)
    return q.reshape(x.shape), s.reshape(*x.shape[:-1], num_scales)


def per_token_group_fakequant_fp8(x: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """x quantized to FP8 e4m3 with UE8M0 scales per `group_size` columns and dequantized back, in x's shape and
    dtype (reference.fp8_fakequant, V4.1's window KV; exact in bf16). One pass over x on the kernel, where the
    reference makes ~15 torch ops over fp32 copies; bit-exact with it."""
    K = x.shape[-1]
    _check_fp8_groups(K, group_size)
    if not use_triton(x) or x.numel() == 0:
        return reference.fp8_fakequant(x, group_size)
    from .quant_kernel import act_quant_fp8_kernel

    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    act_quant_fp8_kernel[(x2.shape[0], cdiv(K // group_size, _GROUPS_PER_PROGRAM))](
        x2, out, out, K // group_size, x2.stride(0), out.stride(0), 0,
        GROUP=group_size, GROUPS_PER_PROGRAM=_GROUPS_PER_PROGRAM, UE8M0=True, ROUND_TRIP=True, enable_fp_fusion=True)
    return out.reshape(x.shape)


def _check_fp8_groups(K: int, group_size: int) -> None:
    """The FP8 quantizers' shape rules (the kernel's, which the references share here)."""
    if K % group_size:
        raise ValueError(f"last dim {K} is not a multiple of group_size {group_size}")
    if group_size & (group_size - 1) or group_size < 16:
        raise ValueError(f"group_size must be a power of two >= 16, got {group_size}")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as rows [M, K] with a unit last stride, the FP8 kernel's input (a view where x allows it)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def per_token_group_quant_fp4(
    x: torch.Tensor, group_size: int = 32, scale_fmt: str = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP4 e2m1 quantization of V4.1 (reference.fp4_quant): x [..., K] -> (packed uint8 [..., K/2] with the
    low nibble = even column, scale [..., K/group_size] float8_e8m0fnu ("ue8m0") or float8_e4m3fn ("e4m3")).
    The kernel takes either scale format (group_size a power of two >= 16); bit-exact with the reference run on
    CUDA (quant_kernel's docstring)."""
    groups = _fp4_kernel_groups(x, group_size, scale_fmt)
    if groups is None:
        return reference.fp4_quant(x, group_size, scale_fmt)
    from .quant_kernel import fp4_quant_kernel

    packed = torch.empty(groups.shape[0], group_size // 2, dtype=torch.uint8, device=x.device)
    scale_bytes = torch.empty(groups.shape[0], dtype=torch.uint8, device=x.device)
    fp4_quant_kernel[(cdiv(groups.shape[0], _GROUPS_PER_PROGRAM),)](
        groups, packed, scale_bytes, groups.shape[0], GROUP=group_size, GROUPS_PER_PROGRAM=_GROUPS_PER_PROGRAM,
        ROUND_TRIP=False, E4M3=scale_fmt == "e4m3", enable_fp_fusion=True)
    K = x.shape[-1]
    scale_dtype = torch.float8_e4m3fn if scale_fmt == "e4m3" else torch.float8_e8m0fnu
    return (packed.reshape(*x.shape[:-1], K // 2),
            scale_bytes.view(scale_dtype).reshape(*x.shape[:-1], K // group_size))


def per_token_group_fakequant_fp4(x: torch.Tensor, group_size: int = 32, scale_fmt: str = "ue8m0") -> torch.Tensor:
    """x quantized to FP4 e2m1 per `group_size` columns and dequantized back, in x's shape and dtype
    (reference.fp4_fakequant; exact in bf16). One pass over x on the kernel, where the reference makes ~30 torch
    ops over fp32 copies; bit-exact with it (run on CUDA)."""
    groups = _fp4_kernel_groups(x, group_size, scale_fmt)
    if groups is None:
        return reference.fp4_fakequant(x, group_size, scale_fmt)
    from .quant_kernel import fp4_quant_kernel

    out = torch.empty(groups.shape, dtype=x.dtype, device=x.device)
    fp4_quant_kernel[(cdiv(groups.shape[0], _GROUPS_PER_PROGRAM),)](
        groups, out, out, groups.shape[0], GROUP=group_size, GROUPS_PER_PROGRAM=_GROUPS_PER_PROGRAM, ROUND_TRIP=True,
        E4M3=scale_fmt == "e4m3", enable_fp_fusion=True)
    return out.reshape(x.shape)


def _fp4_kernel_groups(x: torch.Tensor, group_size: int, scale_fmt: str) -> torch.Tensor | None:
    """x's values as contiguous groups [n, group_size] for fp4_quant_kernel, or None where the reference runs:
    no Triton for x's device, a group size the kernel does not take, or no elements. Shapes the reference would
    reject raise here with its message."""
    if scale_fmt not in ("ue8m0", "e4m3"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r} (expected 'ue8m0' or 'e4m3')")
    if x.shape[-1] % group_size:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the quant block {group_size}")
    if not use_triton(x) or x.numel() == 0 or group_size < 16 or group_size & (group_size - 1):
        return None
    return x.contiguous().view(-1, group_size)
