"""Fused Triton kernels for the hyper-connection ops of ops.py (the references): hc_mixes, hc_collapse, hc_expand.

Why: in the prefill profile (docs/reports/prefill-r1-grouped-moe.md) the torch versions cost 7.2 ms per layer at
4,096 tokens (287 ms of a 1,948 ms 40-layer step): an fp32 copy of the four streams, an fp32 cuBLAS SGEMM with 24
output columns, and ~30 small elementwise kernels per mix (Sinkhorn's 20 iterations on [T, 4, 4]). The streams are
bf16 [T, 4, D]; each kernel here reads them once.

- `hc_mixes_fused`, split-K in two kernels (docs/reports/runtime-hc-mix-splitk.md). The first version, one program
  per 16 tokens streaming all 4*D features, ran 2.27 ms at 4,096 tokens (256 programs on 132 SMs, three 16-column
  fp32 dots per chunk), ~10x its traffic time.
  - `hc_mix_partial_kernel`: program (token block, K slice) reads its [BLOCK_T, K_SLICE] piece of H once and
    writes the slice's 24 projections and its sum of squares (column 24) to an fp32 workspace [splits, T, 32].
  - `hc_mix_finish_kernel`: sums the slices in ascending order (deterministic, no atomics), then computes pre,
    post and comb with the whole Sinkhorn normalisation in registers.
  The K slice is fixed (MixConfig.k_slice), not derived from T, so a token's mixes do not depend on the batch. The
  token block is chosen by T (mix_block_t): it does not enter a token's sums (each chunk's MMA starts from a fresh
  accumulator), and on H200 blocks of 16-128 tokens gave the same bits at 1-4,096 tokens (session 43).
- `hc_collapse_fused`: u = sum_k pre[k] * H[k] (fp32, bf16 out).
- `hc_expand_fused`: H'[j] = post[j] * y + sum_i comb[i, j] * H[i] (fp32, bf16 out).
- `hc_expand_collapse_fused`: the same kernel also collapsing H' with a `pre` known before the expand (the
  attention expand's H' feeds the FFN's collapse with the attention mixes' pre), so that collapse does not read H'
  again.

Numerics: the same formulas in fp32 as ops.py, with other summation orders (the projection's K-sum, the stream
sums); results agree with the references to fp32 rounding before the bf16 casts (tests: test_hyper_connections.py).
The projection's products are fp32 in both dot modes: "ieee" multiplies in fp32 (FMA), "bf16x3" writes each fp32
weight exactly as the sum of three bf16 parts (8 + 8 + 8 significand bits) and multiplies the bf16 streams (exact
in bf16) by each part on tensor cores with fp32 accumulation; no product is rounded to TF32.
"""

from __future__ import annotations

from dataclasses import dataclass
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
MIX_COLUMNS = 2 * HC + HC * HC  # pre, post, comb projections: 24
WORKSPACE_COLUMNS = 32  # the 24 projections, the sum of squares in column 24, zeros: one 32-wide dot (N >= 16)
FINISH_BLOCK_T = 32
POINTWISE_BLOCK_T = 16
POINTWISE_BLOCK_D = 256


@dataclass(frozen=True)
class MixConfig:
    """Tiling of the split-K mix kernels. The defaults are the production setting; benchmarks/bench_hc.py sweeps
    others. block_t tokens x block_k features per step of a program; each program covers k_slice features (a
    multiple of block_k). dot: "ieee" (fp32 FMA dot) or "bf16x3" (exact three-part bf16 split, tensor cores).
    Defaults: the fastest tiling within the 1e-5 bar on H200 (docs/reports/runtime-hc-mix-splitk.md): bf16x3,
    128 x 64: 0.086 ms at T = 4,096 against 0.57 ms for the fastest ieee tiling. Slices of 1,024 since session 41
    (20 programs per token block, chains of 16 steps): at 64 decode tokens 29.8 against 47.9 us for 2,048 (512:
    24.0 us, but 0.90x at 4,096 tokens), at 4,096 tokens 77.9 against 80.7 us (CUDA-graph replay).
    block_t None (the default): mix_block_t(T), the token block by the call's size."""

    block_t: int | None = None
    block_k: int = 64
    k_slice: int = 1024
    dot: str = "bf16x3"
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        if (self.k_slice % self.block_k or self.block_k < 16 or (self.block_t is not None and self.block_t < 16)
                or self.dot not in ("ieee", "bf16x3")):
            raise ValueError(f"bad MixConfig {self}")


DEFAULT_MIX = MixConfig()


def mix_block_t(tokens: int) -> int:
    """The partial kernel's token block for a call of `tokens` tokens: more programs where the call is small. H200,
    session 43 (benchmarks/exp_hc_decode_tiles.py, both kernels, CUDA-graph replay, us at 1 / 64 / 128 / 512 / 4,096
    tokens): block 16: 18.0 / 20.1 / 24.6 / 41.6 / 257.9; 64: 20.9 / 22.6 / 22.6 / 26.9 / 88.7; 128 (the block of
    sessions 3-42): 23.7 / 29.9 / 30.0 / 30.3 / 78.4; 32 was slower than 16 and 64 everywhere."""
    return 16 if tokens <= 64 else 64 if tokens <= 512 else 128


if triton is not None:

    @triton.jit
    def hc_mix_partial_kernel(h_ptr, fn_ptr, ws_ptr, T, K, K_SLICE, MIX: tl.constexpr, NW: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BF16X3: tl.constexpr):
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)  # t * K passes 2^31 past ~105k tokens
        split = tl.program_id(1)
        t_mask = t < T
        n = tl.arange(0, NW)
        acc = tl.zeros((BLOCK_T, NW), dtype=tl.float32)
        ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
        k_begin = split * K_SLICE
        for k0 in range(k_begin, tl.minimum(k_begin + K_SLICE, K), BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < K
            xb = tl.load(h_ptr + t[:, None] * K + k[None, :], mask=t_mask[:, None] & k_mask[None, :], other=0.0)
            x = xb.to(tl.float32)
            ss += tl.sum(x * x, axis=1)
            w = tl.load(fn_ptr + n[None, :] * K + k[:, None], mask=k_mask[:, None] & (n < MIX)[None, :], other=0.0)
            if BF16X3:
                w_hi = w.to(tl.bfloat16)
                rest = w - w_hi.to(tl.float32)  # exact: the low 16 significand bits
                w_mid = rest.to(tl.bfloat16)
                w_lo = (rest - w_mid.to(tl.float32)).to(tl.bfloat16)  # exact: w = w_hi + w_mid + w_lo
                # smallest part first; the chunk's sum joins acc by a separate fp32 add (a fresh accumulator per
                # chunk keeps the tensor cores' accumulation chain to one chunk)
                part = tl.dot(xb, w_lo, out_dtype=tl.float32)
                part = tl.dot(xb, w_mid, part)
                acc += tl.dot(xb, w_hi, part)
            else:
                acc = tl.dot(x, w, acc, input_precision="ieee")
        out = tl.where((n == MIX)[None, :], ss[:, None], acc)
        tl.store(ws_ptr + (split * T + t)[:, None] * NW + n[None, :], out, mask=t_mask[:, None])

    @triton.jit
    def hc_mix_finish_kernel(ws_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr, T, K, n_splits,
                             norm_eps, hc_eps, SINKHORN_ITERS: tl.constexpr, HCS: tl.constexpr, NW: tl.constexpr,
                             BLOCK_T: tl.constexpr):
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        t_mask = t < T
        g = tl.arange(0, HCS)
        ij = tl.arange(0, HCS * HCS)
        m_pre = tl.zeros((BLOCK_T, HCS), dtype=tl.float32)
        m_post = tl.zeros((BLOCK_T, HCS), dtype=tl.float32)
        m_comb = tl.zeros((BLOCK_T, HCS * HCS), dtype=tl.float32)
        ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for split in range(n_splits):  # ascending: the same order for every token and every T
            row = ws_ptr + (split * T + t) * NW
            m_pre += tl.load(row[:, None] + g[None, :], mask=t_mask[:, None], other=0.0)
            m_post += tl.load(row[:, None] + HCS + g[None, :], mask=t_mask[:, None], other=0.0)
            m_comb += tl.load(row[:, None] + 2 * HCS + ij[None, :], mask=t_mask[:, None], other=0.0)
            ss += tl.load(row + 2 * HCS + HCS * HCS, mask=t_mask, other=0.0)
        r = 1.0 / tl.sqrt(ss / K + norm_eps)
        s0 = tl.load(scale_ptr)
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        pre = tl.sigmoid(m_pre * r[:, None] * s0 + tl.load(base_ptr + g)[None, :]) + hc_eps
        post = 2 * tl.sigmoid(m_post * r[:, None] * s1 + tl.load(base_ptr + HCS + g)[None, :])
        tl.store(pre_ptr + t[:, None] * HCS + g[None, :], pre, mask=t_mask[:, None])
        tl.store(post_ptr + t[:, None] * HCS + g[None, :], post, mask=t_mask[:, None])
        # comb [BT, i (source), j (target)]: softmax over j, then Sinkhorn: columns (sum over i), then rows, ...
        c = m_comb * r[:, None] * s2 + tl.load(base_ptr + 2 * HCS + ij)[None, :]
        c = tl.reshape(c, (BLOCK_T, HCS, HCS))
        c = tl.exp(c - tl.max(c, axis=2)[:, :, None])
        c = c / tl.sum(c, axis=2)[:, :, None] + hc_eps
        c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
        for _ in range(SINKHORN_ITERS - 1):
            c = c / (tl.sum(c, axis=2)[:, :, None] + hc_eps)
            c = c / (tl.sum(c, axis=1)[:, None, :] + hc_eps)
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
            acc = tl.fma(w[:, None], h, acc)  # explicit: hc_expand_kernel's collapse computes the same FMAs
        tl.store(out_ptr + t[:, None] * D + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def hc_expand_kernel(y_ptr, h_ptr, post_ptr, comb_ptr, out_ptr, pre_ptr, u_ptr, T, D, HCS: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, COLLAPSE: tl.constexpr):
        """out = the expanded streams (bf16); COLLAPSE: also u = sum_j pre[j] * out[j] from the stored (rounded)
        values, as hc_collapse_kernel would compute it from out (pre_ptr and u_ptr are unused otherwise)."""
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        tm = t < T
        m = tm[:, None] & (d < D)[None, :]
        y = tl.load(y_ptr + t[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        u = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        for j in tl.static_range(HCS):
            # Explicit FMAs: with `acc += c * h` the backend contracted post * y + c0 * h0 either way round, per
            # element and per tile shape (triton 3.6 PTX: fma(post, y, c0 * h0) beside fma(c0, h0, post * y)), so
            # the COLLAPSE variant's H' differed from the plain one's in the last bit (H200, session 37 run 1)
            acc = tl.load(post_ptr + t * HCS + j, mask=tm, other=0.0)[:, None] * y
            for i in tl.static_range(HCS):
                c = tl.load(comb_ptr + t * (HCS * HCS) + i * HCS + j, mask=tm, other=0.0)
                h = tl.load(h_ptr + (t[:, None] * HCS + i) * D + d[None, :], mask=m, other=0.0).to(tl.float32)
                acc = tl.fma(c[:, None], h, acc)
            stored = acc.to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + (t[:, None] * HCS + j) * D + d[None, :], stored, mask=m)
            if COLLAPSE:
                u = tl.fma(tl.load(pre_ptr + t * HCS + j, mask=tm, other=0.0)[:, None], stored.to(tl.float32), u)
        if COLLAPSE:
            tl.store(u_ptr + t[:, None] * D + d[None, :], u.to(u_ptr.dtype.element_ty), mask=m)


def available(H: torch.Tensor) -> bool:
    """Whether the fused kernels apply: Triton importable, bf16 streams on CUDA, HC of them (what the kernels
    are written for; anything else takes the torch references)."""
    return triton is not None and H.is_cuda and H.dtype == torch.bfloat16 and H.dim() == 3 and H.shape[1] == HC


def hc_mixes_fused(H: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, cfg: V41Config,
                   mix: MixConfig = DEFAULT_MIX) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ops.hc_mixes, same arguments. H bf16 [T, 4, D]; fn [24, 4*D], scale [3], base [24] (any float dtype).
    Returns (pre fp32 [T, 4], post fp32 [T, 4], comb fp32 [T, 4, 4]). mix: the kernels' tiling (benchmarks)."""
    T, hc, D = H.shape
    K = hc * D
    H = H.contiguous()
    fn, scale, base = fn.float().contiguous(), scale.float().contiguous(), base.float().contiguous()
    pre = torch.empty(T, hc, dtype=torch.float32, device=H.device)
    post = torch.empty_like(pre)
    comb = torch.empty(T, hc, hc, dtype=torch.float32, device=H.device)
    if T:
        n_splits = triton.cdiv(K, mix.k_slice)
        workspace = torch.empty(n_splits, T, WORKSPACE_COLUMNS, dtype=torch.float32, device=H.device)
        block_t = mix.block_t or mix_block_t(T)
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        hc_mix_partial_kernel[(triton.cdiv(T, block_t), n_splits)](
            H, fn, workspace, T, K, mix.k_slice, MIX=MIX_COLUMNS, NW=WORKSPACE_COLUMNS, BLOCK_T=block_t,
            BLOCK_K=mix.block_k, BF16X3=mix.dot == "bf16x3", num_warps=mix.num_warps, num_stages=mix.num_stages,
            enable_fp_fusion=True)
        hc_mix_finish_kernel[(triton.cdiv(T, FINISH_BLOCK_T),)](
            workspace, scale, base, pre, post, comb, T, K, n_splits, cfg.rms_norm_eps, cfg.hc_eps,
            SINKHORN_ITERS=cfg.hc_sinkhorn_iters, HCS=hc, NW=WORKSPACE_COLUMNS, BLOCK_T=FINISH_BLOCK_T,
            enable_fp_fusion=True)
    return pre, post, comb


def hc_collapse_fused(H: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """ops.hc_collapse: bf16 [T, D] = sum_k pre[:, k] * H[:, k] in fp32."""
    T, hc, D = H.shape
    out = torch.empty(T, D, dtype=H.dtype, device=H.device)
    if T:
        grid = (triton.cdiv(T, POINTWISE_BLOCK_T), triton.cdiv(D, POINTWISE_BLOCK_D))
        hc_collapse_kernel[grid](H.contiguous(), pre.float().contiguous(), out, T, D, HCS=hc,
                                 BLOCK_T=POINTWISE_BLOCK_T, BLOCK_D=POINTWISE_BLOCK_D, enable_fp_fusion=True)
    return out


def hc_expand_fused(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """ops.hc_expand: bf16 [T, 4, D], H'[j] = post[j] * y + sum_i comb[i, j] * H[i] in fp32."""
    return _launch_expand(y, H, post, comb, None)[0]


def hc_expand_collapse_fused(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                             pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.hc_expand_collapse: (H' as hc_expand_fused, bit for bit; bf16 [T, D] = sum_j pre[:, j] * H'[:, j] in
    fp32), one kernel: the collapse comes from the values the expand stores instead of a second read of H'."""
    return _launch_expand(y, H, post, comb, pre)


def _launch_expand(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                   pre: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hc_expand_kernel, collapsing with pre when it is given."""
    T, hc, D = H.shape
    out = torch.empty(T, hc, D, dtype=H.dtype, device=H.device)  # not empty_like: it keeps a permuted H's strides
    u = None if pre is None else torch.empty(T, D, dtype=H.dtype, device=H.device)
    # the collapse's fp32 accumulator does not fit beside the expand's 256-wide tile (offline, triton 3.6, sm_90a:
    # 208 registers without it; 255 and 16 bytes of stack with it; at 128 wide 128 and 16 bytes of stack: four words
    # stored and reloaded once per thread)
    block_d = POINTWISE_BLOCK_D if pre is None else POINTWISE_BLOCK_D // 2
    if T:
        grid = (triton.cdiv(T, POINTWISE_BLOCK_T), triton.cdiv(D, block_d))
        hc_expand_kernel[grid](y.contiguous(), H.contiguous(), post.float().contiguous(), comb.float().contiguous(),
                               out, post if pre is None else pre.float().contiguous(), out if u is None else u, T, D,
                               HCS=hc, BLOCK_T=POINTWISE_BLOCK_T, BLOCK_D=block_d, COLLAPSE=pre is not None,
                               enable_fp_fusion=True)
    return out, u
