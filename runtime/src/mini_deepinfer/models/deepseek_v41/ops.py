"""The V4.1 building blocks as plain functions over a flat run of tokens (V41_MODEL.md section 2).

Both the sequential reference (reference.py) and the batched, paged engine model (model.py) are compositions of
these functions; they differ only in where attention state lives. Every function documents its dtypes, since the
reference's rounding points (bf16 casts between fp32 steps) are part of the numerics we reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mini_deepgemm import (fold_fp4_weights, fold_fp8_weight_scales, fp8_fp4_gemm_nt,
                           per_token_group_fakequant_fp4, per_token_group_fakequant_fp8, per_token_group_quant_fp8)
from mini_deepgemm.reference import (
    act_dequant,
    fold_ue8m0_to_128,
    fp4_fakequant,
    fp4_from_fp8_mma_order,
    fp4_linear_ref,
    fp8_fakequant,
    fp8_linear_ref,
    ue8m0_from_fold_128,
    weight_dequant_fp8,
)

from mini_deepinfer.layers import engram_kernels as egk
from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.layers import moe_route as routef
from mini_deepinfer.layers import rmsnorm as rmsf
from mini_deepinfer.layers import rope as ropef
from mini_deepinfer.layers.linear_fp32 import linear_fp32, linear_fp32_ref
from mini_deepinfer.models.deepseek_v41.config import LayerRole, V41Config

Weights = dict[str, torch.Tensor]


class KernelWeights(dict):
    """A weights dict whose FP8 / FP4 linears run through mini-deepgemm's GEMM kernels (Triton, on CUDA).

    The engine model uses it; the reference keeps a plain dict, so the oracle never depends on a kernel. On CPU
    mini-deepgemm falls back to its own references (same math, fp32 sums possibly in another order).

    fp4_scale_max: the largest UE8M0 byte of each stacked FP4 expert scale tensor (`*.experts.w13.scale`,
    `*.experts.w2.scale`), read once here (a host sync at load, none per step) and passed to the grouped GEMMs as
    their weight_scale_max, which lets the kernels fold the conversion's 2^126 into the scale (mini_deepgemm.gemm).
    fp4_folded: the same tensors folded for mini-deepgemm's FP8-MMA route (`fold_fp4_weights`, also once here), passed
    as `folded` in every layout so that prefill and decode share its numerics; absent where the route does not apply (N
    or K not a multiple of 128, a row's scales spanning more than 11, or a CUDA device without the route's kernels: the
    bf16 route). A folded tensor's `.weight` is reordered in place into the route's order (no extra memory: the stacks
    are engine_weights' own; on CPU the references read it back per call), and so are its views (moe.expert_views's
    per-expert weights, which ops.moe, the oracle, reads one by one: `linear` reads those back per call).
    fp4_route_order names every weight held in the route's order. Replacing a weight or its scale drops its entries (the
    GEMM then assumes nothing; set a new `.weight` in the checkpoint's order); changing a weight tensor in place is not
    supported; drop_fp8_mma_route() returns every expert weight to the checkpoint's order and the bf16 route. A second
    KernelWeights over a stack that one already reordered (an engine's weights passed back in) raises ValueError.
    fold_dense_fp8 (default): every dense FP8 linear weight (e4m3 [N, K] with UE8M0 [N/32, K/32], N and K multiples of
    128) is replaced by its folded form (`fold_fp8_weight_scales`: values re-expressed under each 128 x 128
    block's largest scale, within calc_diff ~1e-12 of the V4.1 product; docs/reports/deepgemm-v41-fold.md), held
    with both scale forms: `.scale` UE8M0 [N/32, K/32] (each 128 x 128 block's one exponent, repeated) and
    `.scale_128` fp32 [N/128, K/128]. `linear` runs calls of at least DENSE_FOLD_MIN_TILES output tiles on the
    V3-recipe GEMMs (activations quantized with fold_128, promotion every 128 of K: 1.5-1.7x at 4,096 rows) and
    smaller ones on the V4.1 kernels with `.scale`. No extra memory. False keeps the weights as loaded.
    Shared experts: w1 and w3 of each (`{p}.shared_experts.w1` / `.w3`, FP8 of one shape) are stacked into
    `{p}.shared_experts.w13` ([2I, D], w1 rows then w3 rows, every scale form alike), w1 and w3 kept as views of its
    halves (no extra memory): moe.shared_expert quantizes x once and runs one GEMM for both. Replacing w1 or w3
    drops w13.
    """

    def __init__(self, *args, fold_dense_fp8: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if fold_dense_fp8:
            # a weight folded before (engram_dense's copy under EP x DP) carries its .scale_128 and is left alone
            for name in [n for n in self if n.endswith(".weight")]:
                base = name.removesuffix(".weight")
                w, s = self[name], self.get(f"{base}.scale")
                dense_fp8 = (w.dtype == torch.float8_e4m3fn and w.dim() == 2 and s is not None and s.dtype ==
                             torch.float8_e8m0fnu and tuple(s.shape) == (w.shape[0] // 32, w.shape[1] // 32))
                if dense_fp8 and w.shape[0] % 128 == 0 and w.shape[1] % 128 == 0 and f"{base}.scale_128" not in self:
                    folded, scale_128 = fold_fp8_weight_scales(w, s)
                    per_32_columns = ue8m0_from_fold_128(scale_128).view(torch.uint8)  # [N / 128, K / 32]
                    super().__setitem__(name, folded)
                    super().__setitem__(f"{base}.scale", per_32_columns.repeat_interleave(4, 0)
                                        .view(torch.float8_e8m0fnu))
                    super().__setitem__(f"{base}.scale_128", scale_128)
        for name in [n for n in self if n.endswith(".shared_experts.w1.weight")]:
            self._stack_shared_w13(name.removesuffix(".w1.weight"))
        scales = {name: t for name, t in self.items()
                  if name.endswith((".experts.w13.scale", ".experts.w2.scale")) and t.numel()}
        self.fp4_scale_max = {name: int(t.view(torch.uint8).max()) for name, t in scales.items()}
        self.fp4_folded, self.fp4_route_order = {}, set()
        on_storage: dict[int, set[str]] = {}  # the names on each storage: a stack and its views (moe.expert_views)
        for name, t in self.items():
            on_storage.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
        for name, t in scales.items():
            weight = self.get(name.removesuffix(".scale") + ".weight")
            fits = t.shape[1] % 128 == 0 and t.shape[2] % 4 == 0 and weight is not None and weight.is_contiguous()
            # a stack reordered in place carries a mark, so that a second KernelWeights over it (an engine's
            # weights passed back in) raises instead of reordering its bytes again
            if getattr(weight, "in_fp8_mma_order", False):
                raise ValueError(f"{name.removesuffix('.scale')}.weight is already in the FP8-MMA route's order "
                                 "(another KernelWeights reordered it in place): build from the checkpoint's weights")
            route = fold_fp4_weights(weight, t.contiguous(), out=weight) if fits else None
            if route is not None:
                weight.in_fp8_mma_order = True
                self.fp4_route_order |= on_storage[weight.untyped_storage().data_ptr()]
                self.fp4_folded[name] = route[1]

    def drop_fp8_mma_route(self) -> None:
        """Every FP4 expert weight back in the checkpoint's order and its folded scales dropped: the experts' GEMMs
        then take the bf16-MMA route (bench_prefill's --moe-route bf16)."""
        for name in self.fp4_folded:
            weight = self[name.removesuffix(".scale") + ".weight"]
            fp4_from_fp8_mma_order(weight, out=weight)  # in place, as the load reordered it
            weight.in_fp8_mma_order = False
        self.fp4_folded.clear()
        self.fp4_route_order.clear()

    def _stack_shared_w13(self, p: str) -> None:
        """`{p}.w13.{kind}` = w1 | w3 along the rows for each stored kind, w1 and w3 re-pointed at its halves."""
        kinds = [k for k in ("weight", "scale", "scale_128") if f"{p}.w1.{k}" in self]
        w1, w3 = self[f"{p}.w1.weight"], self.get(f"{p}.w3.weight")
        if (w1.dtype != torch.float8_e4m3fn or w1.dim() != 2 or w3 is None or w3.dtype != w1.dtype
                or any(self.get(f"{p}.w3.{k}") is None or self[f"{p}.w3.{k}"].shape != self[f"{p}.w1.{k}"].shape
                       for k in kinds)):
            return
        for k in kinds:
            a, b = self[f"{p}.w1.{k}"], self[f"{p}.w3.{k}"]
            one_byte = a.element_size() == 1  # FP8 values and UE8M0 scales are concatenated as bytes
            w13 = (torch.cat([a.view(torch.uint8), b.view(torch.uint8)]).view(a.dtype) if one_byte
                   else torch.cat([a, b]))
            super().__setitem__(f"{p}.w13.{k}", w13)
            super().__setitem__(f"{p}.w1.{k}", w13[: a.shape[0]])
            super().__setitem__(f"{p}.w3.{k}", w13[a.shape[0]:])

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        if ".shared_experts.w1." in name or ".shared_experts.w3." in name:  # the stacked form goes stale
            for k in ("weight", "scale", "scale_128"):
                super().pop(name.split(".shared_experts.")[0] + f".shared_experts.w13.{k}", None)
        self.fp4_scale_max.pop(name, None)
        self.fp4_folded.pop(name, None)
        if name.endswith(".weight"):  # a folded expert weight is held in the route's order, a new one is not
            self.fp4_folded.pop(name.removesuffix(".weight") + ".scale", None)
            self.fp4_route_order.discard(name)
        if name.endswith((".weight", ".scale")):  # a replaced dense FP8 weight or scale: its V3 form is stale
            super().pop(name.rsplit(".", 1)[0] + ".scale_128", None)
        super().__setitem__(name, value)


# --------------------------------------------------------------------------- basics
def fp32_matmul(x: torch.Tensor, w: Weights, name: str) -> torch.Tensor:
    """fp32 x @ w[name]^T of bf16 operands (the head and the MoE gate): the reference's fp32 matmul, or for the
    engine model (KernelWeights) layers/linear_fp32.py's kernel (the same exact products summed in another order,
    without an fp32 copy of the weight)."""
    if isinstance(w, KernelWeights):
        return linear_fp32(x, w[name])
    return linear_fp32_ref(x, w[name])


def gather_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """t[rows] for any dtype: 1-byte types (FP8, UE8M0 scales) move as bytes, because index kernels need not
    support the float8 dtypes on every backend."""
    if t.element_size() == 1:
        return t.view(torch.uint8)[rows].view(t.dtype)
    return t[rows]


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype)


def norm(x: torch.Tensor, w: Weights, name: str, eps: float) -> torch.Tensor:
    """rmsnorm(x, w[name], eps): on the fused Triton kernel (layers/rmsnorm.py) for the engine model on CUDA
    (KernelWeights), by the torch function above otherwise (the reference stays kernel-free)."""
    if isinstance(w, KernelWeights) and rmsf.available(x):
        return rmsf.rmsnorm_fused(x, w[name], eps)
    return rmsnorm(x, w[name], eps)


def fake_quant(x: torch.Tensor, w: Weights, fmt: str) -> torch.Tensor:
    """The round trips of the attention's activations: "fp8" (e4m3, UE8M0 per 32: the window KV, fp8_fakequant),
    "fp4" (e2m1, UE8M0 per 32: the indexer's queries and keys) or "fp4_e4m3" (e2m1, e4m3 per 16: the compressed
    KV), the last two fp4_fakequant. mini-deepgemm's one-pass kernels for the engine model (KernelWeights;
    bit-exact with the references run on CUDA, which they fall back to on CPU), the references' torch ops otherwise
    (the reference stays kernel-free)."""
    kernels = isinstance(w, KernelWeights)
    if fmt == "fp8":
        return per_token_group_fakequant_fp8(x, 32) if kernels else fp8_fakequant(x, 32)
    group, scale_fmt = {"fp4": (32, "ue8m0"), "fp4_e4m3": (16, "e4m3")}[fmt]
    return (per_token_group_fakequant_fp4 if kernels else fp4_fakequant)(x, group, scale_fmt)


def linear(x: torch.Tensor, weights: Weights, name: str, block: int = 32, route_of: str | None = None
           ) -> torch.Tensor:
    """Apply the linear `name` (`name.weight`, optional `name.scale`) in its stored format.

    FP8 e4m3 weight: FP8 activation quant per token per 32, fp32 accumulate, bf16 out. Packed FP4 (int8/uint8)
    weight: the same with e2m1 x UE8M0/32 weights. BF16 weight: F.linear in bf16. FP32 weight: fp32 in and out.
    route_of (KernelWeights): the linear whose route (dense_v3_form) this call takes, where it is not `name` itself
    (moe.shared_expert's stacked w13 takes its halves' route).
    """
    w = weights[f"{name}.weight"]
    if isinstance(weights, KernelWeights) and w.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8):
        x2 = x.reshape(-1, x.shape[-1])
        v3_form = dense_v3_form(x2.shape[0], weights, route_of or name)
        a = per_token_group_quant_fp8(x2.contiguous(), block, "ue8m0", fold_128=v3_form) if x2.shape[0] else None
        return quantized_linear(a, x2.shape[0], weights, name, v3_form).view(*x.shape[:-1], w.shape[0])
    if w.dtype == torch.float8_e4m3fn:
        return fp8_linear_ref(x, w, weights[f"{name}.scale"], block)
    if w.dtype in (torch.int8, torch.uint8):
        return fp4_linear_ref(x, w, weights[f"{name}.scale"], block)
    if w.dtype == torch.float32:
        return F.linear(x.float(), w)
    return F.linear(x.to(w.dtype), w)


# Dense FP8 calls of at least this many 128 x 128 output tiles take the V3-recipe route, smaller ones the V4.1 kernels
# with the folded weights: every measured loss of the V3 route was below 64 tiles (4-40 tiles: 0.77-0.96x), every
# call from 64 tiles gained (1.10-1.84x), at 64 to 16,384 rows (session 20 runs 2 and 4,
# docs/reports/deepgemm-v41-fold.md). As a rule (session 21 run 1): its GPU test passed; the medium decode step moved
# within noise against the rows > 64 rule (11.26 -> 11.19 ms at batch 32, 15.18 -> 15.21 at 64, same run).
DENSE_FOLD_MIN_TILES = 64


def dense_v3_form(rows: int, weights: Weights, name: str) -> bool:
    """Whether a call of `rows` rows on the KernelWeights linear `name` [N, K] takes the V3-recipe route (activations
    quantized with fold_128, `name.scale_128`): a folded dense FP8 weight and at least DENSE_FOLD_MIN_TILES
    128 x 128 output tiles; else the V4.1 kernels with `name.scale`."""
    return (f"{name}.scale_128" in weights
            and -(-rows // 128) * -(-weights[f"{name}.weight"].shape[0] // 128) >= DENSE_FOLD_MIN_TILES)


def quantized_linear(a: tuple[torch.Tensor, torch.Tensor] | None, rows: int, weights: Weights, name: str,
                     v3_form: bool) -> torch.Tensor:
    """bf16 [rows, N] = a @ w^T for the KernelWeights linear `name` on mini-deepgemm: a the activations already
    quantized in the route's form (v3_form: fp32 scales per 128, with `name.scale_128`; else UE8M0 per 32, with
    `name.scale`), None when rows is 0."""
    w = weights[f"{name}.weight"]
    out = torch.empty(rows, w.shape[0], dtype=torch.bfloat16, device=w.device)
    if rows:
        if f"{name}.weight" in weights.fp4_route_order:  # an expert's view of a folded stack (ops.moe, the oracle)
            w = fp4_from_fp8_mma_order(w)
        fp8_fp4_gemm_nt(a, (w, weights[f"{name}.scale_128" if v3_form else f"{name}.scale"]), out)
    return out


# --------------------------------------------------------------------------- RoPE
def rope_freqs(cfg: V41Config, role: LayerRole) -> torch.Tensor:
    """fp32 [rope_dim/2] inverse frequencies of one layer: theta^(-2i/d), with YaRN for compressed layers."""
    d = cfg.qk_rope_head_dim
    freqs = 1.0 / (role.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    if role.use_yarn:
        low, high = cfg.yarn_correction_range()
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    return freqs


def apply_rope_(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Interleaved-pair RoPE on the last len(freqs)*2 dims of x, in fp32, cast back into x in place; returns x.

    x: [T, ..., D]; positions: int64 [T]. Pairs (2i, 2i+1) rotate by positions * freqs[i]; inverse conjugates.
    In place because a new tensor would also copy the D - len(freqs)*2 dims RoPE leaves alone (448 of the 512 of
    every q head); a caller that reads x again un-rotated passes a clone (compressed_kv_entry).
    """
    d_rot = freqs.shape[0] * 2
    angles = positions.to(torch.float32)[:, None] * freqs.to(positions.device)[None, :]  # [T, d_rot/2]
    cis = torch.polar(torch.ones_like(angles), angles)
    if inverse:
        cis = cis.conj()
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d_rot // 2]
    rot = x[..., -d_rot:].float().reshape(*x.shape[:-1], d_rot // 2, 2)
    rot = torch.view_as_real(torch.view_as_complex(rot.contiguous()) * cis.view(shape)).flatten(-2)
    x[..., -d_rot:] = rot  # the copy rounds fp32 to x.dtype as rot.to(x.dtype) would
    return x


def rope_(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, w: Weights, inverse: bool = False
          ) -> torch.Tensor:
    """apply_rope_(x, positions, freqs, inverse): on the fused Triton kernel (layers/rope.py) for the engine model on
    CUDA (KernelWeights), by the torch function above otherwise (the reference stays kernel-free)."""
    if isinstance(w, KernelWeights) and ropef.available(x, freqs):
        return ropef.rope_fused_(x, positions, freqs, inverse)
    return apply_rope_(x, positions, freqs, inverse)


# --------------------------------------------------------------------------- hyper-connections
def hc_mixes(H: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, cfg: V41Config
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """H: bf16 [T, hc, D] -> (pre fp32 [T, hc], post fp32 [T, hc], comb fp32 [T, hc, hc]; comb rows = source
    stream, columns = target stream) via an RMS-scaled projection and Sinkhorn normalisation of comb."""
    hc, eps = cfg.hc_mult, cfg.hc_eps
    x = H.float().flatten(1)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
    m = (x @ fn.float().T) * r
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[:, hc: 2 * hc] * scale[1] + base[hc: 2 * hc])
    comb = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(-1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(cfg.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hc_collapse(H: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_k pre[k] * H[k] in fp32, cast to bf16. H: [T, hc, D], pre: [T, hc]."""
    return (pre[:, :, None] * H.float()).sum(1).to(H.dtype)


def hc_expand(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """H'[j] = post[j] * y + sum_i comb[i, j] * H[i] in fp32, cast to bf16."""
    out = post[:, :, None] * y.float()[:, None, :] + torch.einsum("tij,tid->tjd", comb, H.float())
    return out.to(H.dtype)


def hc_expand_collapse(y: torch.Tensor, H: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, pre: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(H' = hc_expand(y, H, post, comb), hc_collapse(H', pre)): one op where pre is known before the expand, so the
    engine's kernel collapses the values it stores (hyper_connections.hc_expand_collapse_fused)."""
    H = hc_expand(y, H, post, comb)
    return H, hc_collapse(H, pre)


# --------------------------------------------------------------------------- attention pieces
def attention_qkv(u: torch.Tensor, positions: torch.Tensor, w: Weights, p: str, cfg: V41Config, freqs: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (qr bf16 [T, q_lora], q bf16 [T, heads, head_dim] with RoPE, kv bf16 [T, head_dim] with RoPE and the
    FP8 round trip of the window cache)."""
    eps = cfg.rms_norm_eps
    qr = norm(linear(u, w, f"{p}.wq_a"), w, f"{p}.q_norm.weight", eps)
    q = linear(qr, w, f"{p}.wq_b").view(-1, cfg.num_attention_heads, cfg.head_dim)
    q = rope_(q, positions, freqs, w)
    kv = norm(linear(u, w, f"{p}.wkv"), w, f"{p}.kv_norm.weight", eps)
    kv = fake_quant(rope_(kv, positions, freqs, w), w, "fp8")
    return qr, q, kv


def compressor_project(u: torch.Tensor, w: Weights, p: str, cfg: V41Config, ratio: int
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token compressor inputs. ratio 1: (normalised latent bf16 [T, D_kv], None), one latent per token.
    ratio > 1: (kv fp32 [T, D_kv], score fp32 [T, D_kv]) to be pooled per group by `compressor_pool`, fp32 products
    of the bf16 operands (`fp32_matmul`: on tensor cores for the engine model)."""
    if ratio == 1:
        return norm(linear(u, w, f"{p}.compressor.wkv"), w, f"{p}.compressor.norm.weight", cfg.rms_norm_eps), None
    return fp32_matmul(u, w, f"{p}.compressor.wkv.weight"), fp32_matmul(u, w, f"{p}.compressor.wgate.weight")


def compressor_pool(kv: torch.Tensor, score: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """kv, score: fp32 [G, r, D] -> latent bf16 [G, D]: per-channel softmax over the r tokens, bf16, RMSNorm."""
    latent = (kv * torch.softmax(score, dim=1)).sum(1).to(torch.bfloat16)
    return rmsnorm(latent, norm_w, eps)


# The compressed KV and index-key rows before and after their FP4 round trips. The reference keeps the round-tripped
# entries; the engine packs the values before the round trip, since packing quantizes them once, with the round
# trip's own quantizer, and gives the same dequantized values. Packing a round-tripped entry would quantize twice:
# free of change for UE8M0 scales, but an e4m3 scale per 16 recomputed from a rounded amax can differ (517 of 10M
# compressed-KV values on random data, tests/test_reference_model.py).
def compressed_kv_rotated(latent: torch.Tensor, group_pos: torch.Tensor, w: Weights, freqs: torch.Tensor
                          ) -> torch.Tensor:
    """Compressed main KV row before its round trip: RoPE at the group's first position, on a copy (latent stays
    un-rotated: index_key_rotated reads it too)."""
    return rope_(latent.clone(), group_pos, freqs, w)


def compressed_kv_entry(latent: torch.Tensor, group_pos: torch.Tensor, w: Weights, freqs: torch.Tensor
                        ) -> torch.Tensor:
    """Compressed main KV entry: compressed_kv_rotated, then the FP4 (e4m3 per 16) round trip."""
    return fake_quant(compressed_kv_rotated(latent, group_pos, w, freqs), w, "fp4_e4m3")


def index_key_rotated(latent: torch.Tensor, group_pos: torch.Tensor, w: Weights, p: str, cfg: V41Config,
                      freqs: torch.Tensor) -> torch.Tensor:
    """Index key before its round trip: RMSNorm(wk(latent)), RoPE at the group start. bf16 [G, 128]."""
    k = norm(linear(latent, w, f"{p}.indexer.wk"), w, f"{p}.indexer.k_norm.weight", cfg.rms_norm_eps)
    return rope_(k, group_pos, freqs, w)


def index_key_entry(latent: torch.Tensor, group_pos: torch.Tensor, w: Weights, p: str, cfg: V41Config,
                    freqs: torch.Tensor) -> torch.Tensor:
    """Index key entry: index_key_rotated, then the FP4 (UE8M0 per 32) round trip. bf16 [G, 128]."""
    return fake_quant(index_key_rotated(latent, group_pos, w, p, cfg, freqs), w, "fp4")


def indexer_queries(qr: torch.Tensor, u: torch.Tensor, positions: torch.Tensor, w: Weights, p: str, cfg: V41Config,
                    freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q bf16 [T, index_heads, index_dim] with RoPE and FP4 round trip, head weights bf16 [T, index_heads])."""
    nh, hd = cfg.index_n_heads, cfg.index_head_dim
    qi = linear(qr, w, f"{p}.indexer.wq_b").view(-1, nh, hd)
    qi = fake_quant(rope_(qi, positions, freqs, w), w, "fp4")
    wts = (linear(u, w, f"{p}.indexer.weights_proj") * (hd ** -0.5 * nh ** -0.5)).to(torch.bfloat16)
    return qi, wts


def window_positions(positions: torch.Tensor, window: int) -> torch.Tensor:
    """int64 [T, window]: positions p-window+1 .. p (ascending), -1 before the sequence start."""
    offs = torch.arange(-window + 1, 1, device=positions.device)
    wp = positions[:, None] + offs[None, :]
    return torch.where(wp >= 0, wp, torch.full_like(wp, -1))


def attention_output(o: torch.Tensor, positions: torch.Tensor, w: Weights, p: str, cfg: V41Config,
                     freqs: torch.Tensor) -> torch.Tensor:
    """Inverse RoPE on the attention output, grouped low-rank wo_a (bf16 batched GEMM) then wo_b (FP8). [T, D] bf16.
    The RoPE rotates o in place: callers pass the attention kernel's fresh output and do not read it again."""
    o = rope_(o, positions, freqs, w, inverse=True)
    G = cfg.o_groups
    og = o.reshape(o.shape[0], G, -1)
    wo_a = w[f"{p}.wo_a.weight_bf16"].view(G, cfg.o_lora_rank, -1)
    # one batched GEMM written straight into z's [T, G, r] layout (batch stride r, row stride G x r): the einsum
    # wrote [G, T, r], and z.flatten(1) then copied it (session 35's prefill profile: a copy kernel of ~97 us per
    # layer at 4,096 tokens in this stage)
    z = torch.empty((o.shape[0], G, cfg.o_lora_rank), dtype=o.dtype, device=o.device)
    torch.bmm(og.transpose(0, 1), wo_a.transpose(1, 2), out=z.transpose(0, 1))
    return linear(z.flatten(1), w, f"{p}.wo_b")


# --------------------------------------------------------------------------- MoE
def moe_route(x: torch.Tensor, w: Weights, p: str, cfg: V41Config) -> tuple[torch.Tensor, torch.Tensor]:
    """sqrt(softplus) scores, biased top-k, unbiased normalised weights x route scale.
    Returns (expert ids int64 [T, k], weights fp32 [T, k]). The engine model on CUDA (KernelWeights) routes in two
    Triton launches (layers/moe_route.py: the gate split-K, then the tail in one kernel), otherwise the gate's
    fp32_matmul and moe_route_from_scores (the reference stays kernel-free)."""
    gate, bias = w[f"{p}.gate.weight"], w[f"{p}.gate.bias"]
    if isinstance(w, KernelWeights) and routef.available(x, gate, cfg.num_experts_per_tok):
        return routef.moe_route_fused(x, gate, bias, cfg.num_experts_per_tok, cfg.gate_temp,
                                      cfg.routed_scaling_factor)
    return moe_route_from_scores(fp32_matmul(x, w, f"{p}.gate.weight"), bias, cfg)


def moe_route_from_scores(scores: torch.Tensor, bias: torch.Tensor, cfg: V41Config
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_route after the gate: scores fp32 [T, E], bias [E] -> (expert ids int64 [T, k], weights fp32 [T, k]).
    The torch chain: the reference, and the oracle of layers/moe_route.py's kernel."""
    s = F.softplus(scores / cfg.gate_temp).sqrt()
    idx = (s + bias.float()).topk(cfg.num_experts_per_tok, dim=-1).indices
    wt = s.gather(1, idx)
    wt = wt / (wt.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
    return idx, wt


def swiglu_expert(x: torch.Tensor, w: Weights, p: str, cfg: V41Config, row_weight: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Clamped SwiGLU expert; a routed expert's weight multiplies h before w2's activation quant. bf16 [T, D]."""
    lim = cfg.swiglu_limit
    g = linear(x, w, f"{p}.w1").float().clamp(max=lim)
    u = linear(x, w, f"{p}.w3").float().clamp(-lim, lim)
    h = F.silu(g) * u
    if row_weight is not None:
        h = row_weight[:, None] * h
    return linear(h.to(torch.bfloat16), w, f"{p}.w2")


def moe(x: torch.Tensor, w: Weights, p: str, cfg: V41Config) -> torch.Tensor:
    """Routed experts summed in fp32 in expert-id order, plus the shared expert, cast to bf16."""
    idx, wt = moe_route(x, w, p, cfg)
    k = idx.shape[1]
    # (token, slot) pairs grouped by expert, tokens ascending inside each group; one host read of the group sizes
    order = idx.flatten().argsort(stable=True)
    counts = torch.bincount(idx.flatten(), minlength=cfg.n_routed_experts).tolist()
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n:
            pairs = order[start:start + n]
            rows = pairs // k
            out = swiglu_expert(x[rows], w, f"{p}.experts.{e}", cfg, wt.flatten()[pairs])
            y.index_add_(0, rows, out.float())
            start += n
    y += swiglu_expert(x, w, f"{p}.shared_experts", cfg).float()
    return y.to(torch.bfloat16)


# --------------------------------------------------------------------------- Engram
def engram_inject(H: torch.Tensor, row_ids: torch.Tensor, w: Weights, p: str, cfg: V41Config) -> torch.Tensor:
    """H bf16 [T, hc, D]; row_ids int64 [T, orders*heads] (engram.engram_row_ids). Adds the gated table value to
    every stream (same value, per-stream gate).
    The engine model (KernelWeights) gives wkv the table rows as they are stored (engram_operand): the reference's
    dequantization to bf16 and wkv's quantization of it would give the same values back. On CUDA both that and the
    gate run as the kernels of layers/engram_kernels.py."""
    T, hc, D = H.shape
    table, scale = w[f"{p}.embed.weight"], w[f"{p}.embed.scale"]
    if isinstance(w, KernelWeights):
        name = f"{p}.wkv"
        v3_form = dense_v3_form(T, w, name)
        kernels = egk.available(H, table)
        a = (egk.engram_operand if kernels else engram_operand)(table, scale, row_ids, v3_form)
        kv = quantized_linear(a, T, w, name, v3_form)
        if kernels:
            return egk.engram_gate_fused(H, kv, w[f"{p}.q_weight"], w[f"{p}.k_weight"], cfg.rms_norm_eps)
    else:  # the reference: the rows dequantized to bf16 (exact: e4m3 times a power of two), wkv quantizes them
        kv = linear(act_dequant(*engram_operand(table, scale, row_ids, False)).to(torch.bfloat16), w, f"{p}.wkv")
    return engram_gate(H, kv, w[f"{p}.q_weight"], w[f"{p}.k_weight"], cfg.rms_norm_eps)


def engram_operand(table: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor, fold_128: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """wkv's activations straight from the table: rows e4m3 [rows, W] with UE8M0 scales [rows, W / 32], row_ids
    int64 [T, n] -> (e4m3 [T, n * W], uint8 scales [T, n * W / 32]), or with fold_128 the V3-recipe operand
    (fold_ue8m0_to_128 of those: fp32 scales per 128). The same values as the reference's bf16 dequantization quantized
    again by wkv (UE8M0 per 32): a 32-group keeps its stored scale where its largest code is above 224 (the quantizers
    leave it in (224, 448]), and goes one binade lower with every code doubled where it is 224. Folded, the two can
    differ only where the fold rounds a value to e4m3's subnormals (within fold_ue8m0_to_128's bound)."""
    (T, n), width = row_ids.shape, table.shape[1]  # explicit shapes: a view of 0 rows cannot infer a -1
    flat = row_ids.flatten()
    rows = gather_rows(table, flat).view(T, n * width)
    exps = gather_rows(scale, flat).view(torch.uint8).view(T, n * width // 32)
    return fold_ue8m0_to_128(rows, exps, 1) if fold_128 else (rows, exps)


def engram_gate(H: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float
                ) -> torch.Tensor:
    """The Engram gate and update: H bf16 [T, hc, D], kv bf16 [T, (hc + 1) * D] (wkv's output: hc keys, then the
    value), q_weight / k_weight [hc, D] -> bf16 H + gate * value, one gate per stream from the RMS-normalised dot
    product of H and its key (fp32 throughout)."""
    T, hc, D = H.shape
    key = kv[:, : hc * D].view(T, hc, D).float()
    val = kv[:, hc * D:].float()
    Hf = H.float()
    rstd = torch.rsqrt(Hf.pow(2).mean(-1) + eps) * torch.rsqrt(key.pow(2).mean(-1) + eps)
    qk = q_weight.float() * k_weight.float()
    dot = (Hf * qk[None] * key).sum(-1) * rstd / math.sqrt(D)
    gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(dot.abs().clamp_min(1e-6)))
    return (Hf + gate[..., None] * val[:, None, :]).to(H.dtype)


# --------------------------------------------------------------------------- one decoder block
def decoder_block(H: torch.Tensor, pre: torch.Tensor, w: Weights, lid: int, cfg: V41Config,
                  attention: Callable[[torch.Tensor], torch.Tensor],
                  ffn: Callable[[torch.Tensor], torch.Tensor], collapsed: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block inside the hyper-connection streams (spec 2.1), with the one-sublayer delay of `pre`: the
    attention input collapses H with the `pre` of the previous sublayer, the FFN input with the attention
    boundary's. attention / ffn map bf16 [T, D] -> bf16 [T, D]. collapsed: hc_collapse(H, pre) when the caller has
    it (the previous block's third output, if nothing changed H since), else computed here.
    Returns (H, the pre for the next block, hc_collapse of the two): each sublayer's expand also collapses its
    output with the pre the next sublayer needs, which is known before the expand."""
    p = f"layers.{lid}"
    mixes, collapse, expand_collapse = _hc_ops(H, w)
    a_pre, a_post, a_comb = mixes(H, w[f"{p}.hc_attn_fn"], w[f"{p}.hc_attn_scale"], w[f"{p}.hc_attn_base"], cfg)
    u = norm(collapse(H, pre) if collapsed is None else collapsed, w, f"{p}.attn_norm.weight", cfg.rms_norm_eps)
    H, v = expand_collapse(attention(u), H, a_post, a_comb, a_pre)
    f_pre, f_post, f_comb = mixes(H, w[f"{p}.hc_ffn_fn"], w[f"{p}.hc_ffn_scale"], w[f"{p}.hc_ffn_base"], cfg)
    v = norm(v, w, f"{p}.ffn_norm.weight", cfg.rms_norm_eps)
    H, collapsed = expand_collapse(ffn(v), H, f_post, f_comb, f_pre)
    return H, f_pre, collapsed


def _hc_ops(H: torch.Tensor, w: Weights) -> tuple[Callable, Callable, Callable]:
    """The hyper-connection ops a block uses: the fused Triton kernels (layers/hyper_connections.py, same
    signatures) for the engine model on CUDA (KernelWeights), the torch functions above otherwise (the reference
    stays kernel-free)."""
    if isinstance(w, KernelWeights) and hcf.available(H):
        return hcf.hc_mixes_fused, hcf.hc_collapse_fused, hcf.hc_expand_collapse_fused
    return hc_mixes, hc_collapse, hc_expand_collapse


def initial_streams(h: torch.Tensor, cfg: V41Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings bf16 [T, D] -> (H bf16 [T, hc, D] with every stream = h, pre = one-hot of stream 0)."""
    pre = torch.zeros(h.shape[0], cfg.hc_mult, device=h.device)
    pre[:, 0] = 1.0
    return h[:, None, :].repeat(1, cfg.hc_mult, 1), pre


# --------------------------------------------------------------------------- head
def final_logits(H: torch.Tensor, pre: torch.Tensor, w: Weights, cfg: V41Config) -> torch.Tensor:
    """fp32 logits [T, vocab]."""
    y = norm(hc_collapse(H, pre), w, "norm.weight", cfg.rms_norm_eps)
    return fp32_matmul(y, w, "head.weight")


def prepare_weights(w: Weights) -> Weights:
    """Load-time derived tensors: wo_a dequantized to bf16 (`{p}.wo_a.weight_bf16`; the reference keeps it in bf16,
    spec U3). It replaces the stored FP8 wo_a and its scale: nothing reads those afterwards, and keeping them cost
    33.6 MB per layer, 1.34 GB of HBM per rank for the 40-layer model (session 47), now left to the KV cache."""
    out = dict(w)
    for name, t in w.items():
        if name.endswith("wo_a.weight"):
            base = name[: -len(".weight")]
            bf16 = weight_dequant_fp8(t, w[f"{base}.scale"]) if t.dtype == torch.float8_e4m3fn else t
            out[f"{base}.weight_bf16"] = bf16.to(torch.bfloat16)
            del out[name]
            out.pop(f"{base}.scale", None)
    return out
