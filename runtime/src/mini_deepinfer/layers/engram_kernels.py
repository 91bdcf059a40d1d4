"""The Engram injection's kernels (V41_MODEL.md 2.5): wkv's operand gathered from the table, and the gate and update
after wkv. ops.engram_operand and ops.engram_gate are their references.

Why (docs/reports/runtime-engram-fused.md): the reference injection dequantizes the gathered table rows to bf16 for
wkv, whose quantizer turns them back into the e4m3 values and UE8M0 scales they were stored as, and its gate is a
dozen torch kernels over fp32 [T, hc, D] tensors (H and the keys cast to fp32, their squares, the products with
q_weight * k_weight, the broadcast value, the sum, the cast back). At 4,096 tokens (hc 4, D 5,120) each such tensor
is 335 MB, and the gate's chain moves ~6.5 GB per Engram layer where one read of H, the keys and the value and one
write of H (~0.6 GB) would do.
- engram_operand_kernel: the stored rows as wkv's activations, gathered, and where wkv runs on the V3-recipe kernels
  folded per 128 (quant_kernel.fold_groups_to_128, the quantizer's own fold): one pass over 25 MB at 4,096 tokens.
- engram_gate_kernel: one program per token; a first pass over D sums H^2, key^2 and H * qk * key per stream, the
  gates follow, and a second pass writes H + gate * val (the second read of H and the value hits L2).

Numerics: the operand is bit-exact with ops.engram_operand. The gate follows the reference's formula in fp32, term
by term (the products rounded in its order); only the order of the three sums differs (a tree per block here), so
gates agree to a few fp32 ulp and outputs to one bf16 rounding (tests: runtime/tests/test_engram_kernels.py).
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
    from mini_deepgemm.quant_kernel import fold_groups_to_128
except ImportError:  # CPU-only installs: ops.engram_operand and ops.engram_gate run instead
    triton = None

BLOCK_D = 512  # columns per step: [hc, 512] fp32 tiles, three running sums in registers at 4 warps
ROWS_PER_PROGRAM = 8  # table rows a program of engram_operand_kernel moves (a token has 24)

if triton is not None:

    @triton.jit
    def engram_operand_kernel(table_ptr, scale_ptr, ids_ptr, q_ptr, s_ptr, n_ids, stride_table, stride_scale,
                              stride_q, stride_s, WIDTH: tl.constexpr, ROWS: tl.constexpr, FOLD: tl.constexpr):
        """Token t = program 0, its table rows j = program 1 * ROWS + [0, ROWS) of ids[t, :n_ids]: q[t, j * WIDTH +
        c] = table[ids[t, j], c] and the scales, per 32 as stored (s uint8 [T, n_ids * WIDTH / 32]) or, FOLD, per 128
        as fold_groups_to_128 makes them (s fp32 [T, n_ids * WIDTH / 128], q re-expressed under them)."""
        GROUPS: tl.constexpr = ROWS * (WIDTH // 32)
        t = tl.program_id(0).to(tl.int64)
        g = tl.arange(0, GROUPS)  # (row, group) pairs, row-major: a row's groups are consecutive
        j = tl.program_id(1) * ROWS + g // (WIDTH // 32)
        ok = j < n_ids
        row = tl.load(ids_ptr + t * n_ids + j, mask=ok, other=0)
        col = (g % (WIDTH // 32)) * 32
        c = tl.arange(0, 32)[None, :]
        q = tl.load(table_ptr + row[:, None] * stride_table + col[:, None] + c, mask=ok[:, None], other=0.0)
        e = tl.load(scale_ptr + row * stride_scale + col // 32, mask=ok, other=127)
        out = q_ptr + t * stride_q + (j * WIDTH + col)[:, None] + c
        if FOLD:
            q, folded = fold_groups_to_128(q, e, GROUPS)
            blocks = tl.program_id(1) * (GROUPS // 4) + tl.arange(0, GROUPS // 4)
            tl.store(s_ptr + t * stride_s + blocks, folded, mask=blocks < n_ids * (WIDTH // 128))
        else:
            tl.store(s_ptr + t * stride_s + j * (WIDTH // 32) + col // 32, e, mask=ok)
        tl.store(out, q, mask=ok[:, None])

    @triton.jit
    def engram_gate_kernel(h_ptr, kv_ptr, qw_ptr, kw_ptr, out_ptr, D, stride_h_t, stride_h_s, stride_kv,
                           stride_out_t, stride_out_s, eps, sqrt_d, HC: tl.constexpr, BLOCK_D: tl.constexpr):
        """Token t = program 0: out[t, s] = bf16(H[t, s] + gate[s] * val) with key = kv[t, s * D : (s + 1) * D],
        val = kv[t, HC * D : (HC + 1) * D] and gate[s] = sigmoid(sign(x) * sqrt(max(|x|, 1e-6))),
        x = sum(H * (qw * kw) * key) * rsqrt(mean(H^2) + eps) * rsqrt(mean(key^2) + eps) / sqrt(D)."""
        t = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, HC)[:, None]
        h_row = h_ptr + t * stride_h_t + s * stride_h_s
        kv_row = kv_ptr + t * stride_kv
        hh = tl.zeros([HC, BLOCK_D], dtype=tl.float32)
        kk = tl.zeros([HC, BLOCK_D], dtype=tl.float32)
        hqk = tl.zeros([HC, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)[None, :]
            m = (d < D) & (s < HC)  # [HC, BLOCK_D]: s < HC always holds, it gives the mask its stream axis
            h = tl.load(h_row + d, mask=m, other=0.0).to(tl.float32)
            key = tl.load(kv_row + s * D + d, mask=m, other=0.0).to(tl.float32)
            qk = tl.load(qw_ptr + s * D + d, mask=m, other=0.0).to(tl.float32) * \
                tl.load(kw_ptr + s * D + d, mask=m, other=0.0).to(tl.float32)
            hh += h * h
            kk += key * key
            hqk += (h * qk) * key  # the reference's order: (H * qk) * key
        rstd = tl.math.rsqrt(tl.sum(hh, 1) / D + eps) * tl.math.rsqrt(tl.sum(kk, 1) / D + eps)
        x = tl.sum(hqk, 1) * rstd / sqrt_d
        sign = tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))
        gate = (1.0 / (1.0 + tl.exp(-(sign * tl.sqrt(tl.maximum(tl.abs(x), 1e-6))))))[:, None]
        out_row = out_ptr + t * stride_out_t + s * stride_out_s
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)[None, :]
            m = (d < D) & (s < HC)
            h = tl.load(h_row + d, mask=m, other=0.0).to(tl.float32)
            val = tl.load(kv_row + HC * D + d, mask=d < D, other=0.0).to(tl.float32)
            tl.store(out_row + d, (h + gate * val).to(out_ptr.dtype.element_ty), mask=m)


def available(H: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether engram_operand and engram_gate_fused apply: Triton importable, bf16 streams and the table on CUDA, a
    power-of-two stream count, table rows of a multiple of 128 (the fold's blocks stay within a row)."""
    hc = H.shape[1] if H.dim() == 3 else 0
    return (triton is not None and H.is_cuda and table.is_cuda and H.dtype == torch.bfloat16 and hc > 0
            and hc & (hc - 1) == 0 and table.shape[-1] % 128 == 0)


def engram_operand(table: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor, fold_128: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.engram_operand, same arguments: table e4m3 [rows, W] (W % 128 == 0) with UE8M0 scales [rows, W / 32]
    (float8_e8m0fnu or uint8), row_ids int64 [T, n] -> (e4m3 [T, n * W], the scales: uint8 [T, n * W / 32], or with
    fold_128 fp32 [T, n * W / 128] with the values re-expressed under them)."""
    T, n = row_ids.shape
    W = table.shape[1]
    q = torch.empty(T, n * W, dtype=torch.float8_e4m3fn, device=table.device)
    s = torch.empty(T, n * W // (128 if fold_128 else 32), dtype=torch.float32 if fold_128 else torch.uint8,
                    device=table.device)
    if T and n:
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        engram_operand_kernel[(T, triton.cdiv(n, ROWS_PER_PROGRAM))](
            table, scale.view(torch.uint8), row_ids.contiguous(), q, s, n, table.stride(0), scale.stride(0),
            q.stride(0), s.stride(0), WIDTH=W, ROWS=ROWS_PER_PROGRAM, FOLD=fold_128, num_warps=4,
            enable_fp_fusion=True)
    return q, s


def engram_gate_fused(H: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """ops.engram_gate, same arguments: H bf16 [T, hc, D] (on CUDA, hc a power of two), kv [T, (hc + 1) * D] (wkv's
    bf16 output: hc keys, then the value), q_weight and k_weight [hc, D] -> new H, bf16 [T, hc, D]."""
    T, hc, D = H.shape
    if kv.shape != (T, (hc + 1) * D) or q_weight.shape != (hc, D) or k_weight.shape != (hc, D):
        raise ValueError(f"engram_gate_fused: H {tuple(H.shape)} needs kv [{T}, {(hc + 1) * D}] and q/k weights "
                         f"[{hc}, {D}], got {tuple(kv.shape)}, {tuple(q_weight.shape)}, {tuple(k_weight.shape)}")
    if H.stride(-1) != 1:
        H = H.contiguous()
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    out = torch.empty(T, hc, D, dtype=H.dtype, device=H.device)
    if T == 0:
        return out
    engram_gate_kernel[(T,)](
        H, kv, q_weight.contiguous(), k_weight.contiguous(), out, D, H.stride(0), H.stride(1), kv.stride(0),
        out.stride(0), out.stride(1), eps, math.sqrt(D), HC=hc, BLOCK_D=BLOCK_D, num_warps=4,
        enable_fp_fusion=True)
    return out
