"""Fused Triton kernels for the hyper-connection ops of ops.py (the references): hc_mixes, hc_collapse, hc_expand.

Why: in the prefill profile (docs/reports/prefill-r1-grouped-moe.md) the torch versions cost 7.2 ms per layer at
4,096 tokens (287 ms of a 1,948 ms 40-layer step): an fp32 copy of the four streams, an fp32 cuBLAS SGEMM with 24
output columns, and ~30 small elementwise kernels per mix (Sinkhorn's 20 iterations on [T, 4, 4]). The streams are
bf16 [T, 4, D]; each kernel here reads them once.

- `hc_mixes_fused`: one program per BLOCK_T tokens streams the 4*D features once, accumulating the RMS and the 24
  projections (fp32 dot products, IEEE precision), then computes pre, post and comb with the whole Sinkhorn
  normalisation in registers.
- `hc_collapse_fused`: u = sum_k pre[k] * H[k] (fp32, bf16 out).
- `hc_expand_fused`: H'[j] = post[j] * y + sum_i comb[i, j] * H[i] (fp32, bf16 out).

Numerics: the same formulas in fp32 as ops.py, with other summation orders (the projection's K-sum, the stream
sums); results agree with the references to fp32 rounding before the bf16 casts (tests: test_hyper_connections.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mini_deepinfer.models.deepseek_v41.config import V41Config

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the references in ops.py run instead
    triton = None

HC = 4  # streams the kernels are written for (V41Config.hc_mult; checked at the call)
MIX_BLOCK_T = 16
MIX_BLOCK_K = 128
POINTWISE_BLOCK_T = 16
POINTWISE_BLOCK_D = 256

if triton is not None:

    @triton.jit
    def _projection(x, fn_ptr, col0, K, k_offs, k_mask, NW: tl.constexpr, WIDTH: tl.constexpr):
        """x [BT, BK] fp32 times fn[col0 : col0 + WIDTH, k_offs]^T -> [BT, NW] (columns past WIDTH are 0)."""
        n = tl.arange(0, NW)
        w = tl.load(fn_ptr + (col0 + n)[None, :] * K + k_offs[:, None],
                    mask=k_mask[:, None] & (n < WIDTH)[None, :], other=0.0)
        return tl.dot(x, w, input_precision="ieee")

    @triton.jit
    def hc_mix_kernel(h_ptr, fn_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, T, K,
                      norm_eps, hc_eps, SINKHORN_ITERS: tl.constexpr, HCS: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # t * K passes 2^31 past ~105k tokens
        t_mask = t < T
        NW: tl.constexpr = 16  # tl.dot needs N >= 16: each group's columns padded to 16
        acc_pre = tl.zeros((BLOCK_T, NW), dtype=tl.float32)
        acc_post = tl.zeros((BLOCK_T, NW), dtype=tl.float32)
        acc_comb = tl.zeros((BLOCK_T, NW), dtype=tl.float32)
        ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < K
            x = tl.load(h_ptr + t[:, None] * K + k[None, :], mask=t_mask[:, None] & k_mask[None, :],
                        other=0.0).to(tl.float32)
            ss += tl.sum(x * x, axis=1)
            acc_pre += _projection(x, fn_ptr, 0, K, k, k_mask, NW, HCS)
            acc_post += _projection(x, fn_ptr, HCS, K, k, k_mask, NW, HCS)
            acc_comb += _projection(x, fn_ptr, 2 * HCS, K, k, k_mask, NW, HCS * HCS)
        r = 1.0 / tl.sqrt(ss / K + norm_eps)
        n = tl.arange(0, NW)
        s0 = tl.load(scale_ptr)
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        b_pre = tl.load(base_ptr + n, mask=n < HCS, other=0.0)
        b_post = tl.load(base_ptr + HCS + n, mask=n < HCS, other=0.0)
        b_comb = tl.load(base_ptr + 2 * HCS + n)
        pre = tl.sigmoid(acc_pre * r[:, None] * s0 + b_pre[None, :]) + hc_eps
        post = 2 * tl.sigmoid(acc_post * r[:, None] * s1 + b_post[None, :])
        io = t_mask[:, None] & (n < HCS)[None, :]
        tl.store(pre_ptr + t[:, None] * HCS + n[None, :], pre, mask=io)
        tl.store(post_ptr + t[:, None] * HCS + n[None, :], post, mask=io)
        # comb [BT, i (source), j (target)]: softmax over j, then Sinkhorn: columns (sum over i), then rows, ...
        c = tl.reshape(acc_comb * r[:, None] * s2 + b_comb[None, :], (BLOCK_T, HCS, HCS))
        c = tl.exp(c - tl.max(c, axis=2)[:, :, None])
        c = c / tl.sum(c, axis=2)[:, :, None] + hc_eps
        c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        for _ in range(SINKHORN_ITERS - 1):
            c = c / (tl.sum(c, axis=2)[:, :, None] + hc_eps)
            c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        ij = tl.arange(0, HCS * HCS)
        tl.store(comb_ptr + t[:, None] * (HCS * HCS) + ij[None, :], tl.reshape(c, (BLOCK_T, HCS * HCS)),
                 mask=t_mask[:, None])

    @triton.jit
    def hc_collapse_kernel(h_ptr, pre_ptr, out_ptr, T, D, HCS: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr):
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        m = (t < T)[:, None] & (d < D)[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        for k in tl.static_range(HCS):
            w = tl.load(pre_ptr + t * HCS + k, mask=t < T, other=0.0)
            h = tl.load(h_ptr + (t[:, None] * HCS + k) * D + d[None, :], mask=m, other=0.0).to(tl.float32)
            acc += w[:, None] * h
        tl.store(out_ptr + t[:, None] * D + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def hc_expand_kernel(y_ptr, h_ptr, post_ptr, comb_ptr, out_ptr, T, D, HCS: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        tm = t < T
        m = tm[:, None] & (d < D)[None, :]
        y = tl.load(y_ptr + t[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        for j in tl.static_range(HCS):
            acc = tl.load(post_ptr + t * HCS + j, mask=tm, other=0.0)[:, None] * y
            for i in tl.static_range(HCS):
                c = tl.load(comb_ptr + t * (HCS * HCS) + i * HCS + j, mask=tm, other=0.0)
                h = tl.load(h_ptr + (t[:, None] * HCS + i) * D + d[None, :], mask=m, other=0.0).to(tl.float32)
                acc += c[:, None] * h
            tl.store(out_ptr + (t[:, None] * HCS + j) * D + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)


def available(H: torch.Tensor) -> bool:
    """Whether the fused kernels apply: Triton importable, a CUDA tensor, HC streams."""
    return triton is not None and H.is_cuda and H.dim() == 3 and H.shape[1] == HC


def hc_mixes_fused(H: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, cfg: V41Config
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ops.hc_mixes, same arguments. H bf16 [T, 4, D]; fn [24, 4*D], scale [3], base [24] (any float dtype).
    Returns (pre fp32 [T, 4], post fp32 [T, 4], comb fp32 [T, 4, 4])."""
    T, hc, D = H.shape
    H = H.contiguous()
    fn, scale, base = fn.float().contiguous(), scale.float().contiguous(), base.float().contiguous()
    pre = torch.empty(T, hc, dtype=torch.float32, device=H.device)
    post = torch.empty_like(pre)
    comb = torch.empty(T, hc, hc, dtype=torch.float32, device=H.device)
    if T:
        hc_mix_kernel[(triton.cdiv(T, MIX_BLOCK_T),)](
            H, fn, scale, base, pre, post, comb, T, hc * D, cfg.rms_norm_eps, cfg.hc_eps,
            SINKHORN_ITERS=cfg.hc_sinkhorn_iters, HCS=hc, BLOCK_T=MIX_BLOCK_T, BLOCK_K=MIX_BLOCK_K)
    return pre, post, comb


def hc_collapse_fused(H: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """ops.hc_collapse: bf16 [T, D] = sum_k pre[:, k] * H[:, k] in fp32."""
    T, hc, D = H.shape
    out = torch.empty(T, D, dtype=H.dtype, device=H.device)
    if T:
        grid = (triton.cdiv(T, POINTWISE_BLOCK_T), triton.cdiv(D, POINTWISE_BLOCK_D))
        hc_collapse_kernel[grid](H.contiguous(), pre.float().contiguous(), out, T, D, HCS=hc,
                                 BLOCK_T=POINTWISE_BLOCK_T, BLOCK_D=POINTWISE_BLOCK_D)
    return out


def hc_expand_fused(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """ops.hc_expand: bf16 [T, 4, D], H'[j] = post[j] * y + sum_i comb[i, j] * H[i] in fp32."""
    T, hc, D = H.shape
    out = torch.empty_like(H)
    if T:
        grid = (triton.cdiv(T, POINTWISE_BLOCK_T), triton.cdiv(D, POINTWISE_BLOCK_D))
        hc_expand_kernel[grid](y.contiguous(), H.contiguous(), post.float().contiguous(), comb.float().contiguous(),
                               out, T, D, HCS=hc, BLOCK_T=POINTWISE_BLOCK_T, BLOCK_D=POINTWISE_BLOCK_D)
    return out
