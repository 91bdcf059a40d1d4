"""Byte layouts of V4.1's quantized attention cache (V41_MODEL.md section 5), packed and unpacked.

Rows are packed by mini-deepgemm's quantizers (per_token_group_quant_fp8 / _fp4: one Triton kernel on CUDA,
bit-exact with the reference quantizers run on CUDA, which run elsewhere); unpacking is torch ops.

Every row is a run of uint8 so one gather moves a whole token/entry:

| cache | values | row bytes | layout of a row |
|---|---|---|---|
| window KV (ring of 128 per layer and sequence) | 512 x e4m3, UE8M0 per 32 | 528 | 512 B e4m3, then 16 B biased exponents |
| compressed main KV (paged, one row per compressed entry) | 512 x e2m1, e4m3 per 16 | 288 | 256 B packed e2m1 (low nibble = even dim), then 32 B e4m3 scales |
| index keys (paged) | 128 x e2m1, UE8M0 per 32 | 68 | 64 B packed e2m1, then 4 B biased exponents |

Packing is exact: unpack(pack(x)) equals the reference fake-quant of x bit for bit (the fake-quantized values are
representable in these formats), so a cache stored packed reproduces the reference that keeps bf16 values.
"""

from __future__ import annotations

import torch
from mini_deepgemm import per_token_group_quant_fp4, per_token_group_quant_fp8
from mini_deepgemm.reference import act_dequant, fp4_dequant

WINDOW_ROW_BYTES = 528
COMPRESSED_KV_ROW_BYTES = 288
INDEX_K_ROW_BYTES = 68


def pack_window_fp8(kv: torch.Tensor) -> torch.Tensor:
    """[..., 512] float -> uint8 [..., 528] (FP8 e4m3 + UE8M0 per 32)."""
    q, s = per_token_group_quant_fp8(kv, 32, "ue8m0")
    return torch.cat([q.view(torch.uint8), s.view(torch.uint8)], dim=-1)


def unpack_window_fp8(rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [..., 528] -> [..., 512] in `dtype`."""
    q = rows[..., :512].contiguous().view(torch.float8_e4m3fn)
    s = rows[..., 512:528].contiguous().view(torch.float8_e8m0fnu)
    return act_dequant(q, s, 32).to(dtype)


def pack_compressed_kv_fp4(kv: torch.Tensor) -> torch.Tensor:
    """[..., 512] float -> uint8 [..., 288] (e2m1 + e4m3 scale per 16)."""
    q, s = per_token_group_quant_fp4(kv, 16, "e4m3")
    return torch.cat([q, s.view(torch.uint8)], dim=-1)


def unpack_compressed_kv_fp4(rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [..., 288] -> [..., 512] in `dtype`."""
    q = rows[..., :256]
    s = rows[..., 256:288].contiguous().view(torch.float8_e4m3fn)
    return fp4_dequant(q, s, 16).to(dtype)


def pack_index_k_fp4(k: torch.Tensor) -> torch.Tensor:
    """[..., 128] float -> uint8 [..., 68] (e2m1 + UE8M0 per 32)."""
    q, s = per_token_group_quant_fp4(k, 32, "ue8m0")
    return torch.cat([q, s.view(torch.uint8)], dim=-1)


def unpack_index_k_fp4(rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [..., 68] -> [..., 128] in `dtype`."""
    q = rows[..., :64]
    s = rows[..., 64:68].contiguous().view(torch.float8_e8m0fnu)
    return fp4_dequant(q, s, 32).to(dtype)
