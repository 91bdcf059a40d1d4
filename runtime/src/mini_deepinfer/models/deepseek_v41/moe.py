"""The engine's MoE: routed experts as two grouped GEMMs over a contiguous, expert-sorted row layout, with no host
synchronisation (every size is known from the token count alone).

`ops.moe` is the oracle: a loop over experts (one host read of the counts, three dense GEMMs per expert). This module
computes the same function for the engine model:

1. route (ops.moe_route) -> expert ids [T, k] and weights [T, k];
2. `contiguous_plan`: mini-deepep's receive layout (`plan_expert_segments`) in its single-process case: the T*k
   (token, slot) pairs sorted by expert (stable, so tokens ascend inside an expert as in ops.moe), each expert's
   segment starting at a multiple of 128 (mini-deepgemm's M alignment: no GEMM tile straddles two experts), the
   row space sized for the worst case T*k + min(E, T*k) * 127, so nothing about the routing reaches the host; up
   to MASKED_MAX_TOKENS tokens (decode) `masked_plan` instead reserves T rows per expert ([E, T, K], the masked
   grouped GEMM with small tiles);
3. quantize the T token rows once (per-row quantization commutes with the row gather, so this is bit-identical
   to quantizing each expert's gathered rows) and gather them into the layout;
4. `grouped_expert_ffn`: w1 and w3 of every expert stacked into one [E, 2I, K] weight, so one grouped GEMM gives
   both halves; clamped SwiGLU times the routing weight (before w2's activation quant, as ops.swiglu_expert);
   a second grouped GEMM with w2;
5. each token adds its k outputs in fp32 in ascending expert id, the order ops.moe's index_add_ uses, then the
   shared expert (`shared_expert`: one GEMM for w1 and w3, the fused SwiGLU, w2), then one bf16 cast.

Padding rows (-1 in the layout) are skipped by the GEMMs and never read back.

Where a stacked expert weight takes mini-deepgemm's FP8-MMA route (ops.KernelWeights.fp4_folded), its activations
are quantized folded per 128 (`folds_activations`): fp32 scales per 128 columns instead of UE8M0 per 32, on which
that route's kernels run 1.1-1.3x faster (docs/reports/deepgemm-moe-fold-128.md); the fold rounds values under
~2^-6 of their 128 columns' largest scale.

On CUDA the elementwise steps around the GEMMs (3., the SwiGLU + quantization of 4., 5.) run as fused Triton kernels
that skip padding rows (layers/moe_kernels.py, bit-identical); the torch chains below (`*_torch`) are the CPU path
and the kernels' references.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from mini_deepgemm import (
    get_m_alignment_for_contiguous_layout,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    per_token_group_quant_fp8,
)
from mini_deepep.layout import plan_expert_segments, scatter_rows_values

from mini_deepinfer.layers import moe_kernels
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

Weights = dict[str, torch.Tensor]
QUANT_BLOCK = 32
# Up to this many tokens (decode batches) the experts use the masked layout: [E, T, K] with T rows reserved per
# expert and small GEMM tiles, instead of a 128-row contiguous segment per touched expert (at 64 decode tokens
# that is ~300 experts x 128 rows computed for 384 real rows; docs/reports/runtime-decode.md). Session 44: 64 left
# batches of 128-256 on the contiguous kernel, 1.6 ms per layer at 256 tokens (~4 rows per expert). At 256 the
# masked layout's buffers are ~2.6 GB per layer for V4.1-Flash's 384 experts (the activations and both GEMMs'
# outputs, T rows per expert), ~1.3 GB more than the contiguous one's, transient.
MASKED_MAX_TOKENS = 256


# --------------------------------------------------------------------------- weights
def stack_experts(w: Weights) -> Weights:
    """Stack each MoE layer's routed experts for the grouped GEMMs: `{p}.experts.w13.{weight,scale}` [E, 2I, ...]
    (w1 rows, then w3 rows) and `{p}.experts.w2.{weight,scale}` [E, D, ...], the experts in ascending id (a rank of
    EP x DP holds a contiguous range; group g is its g-th expert). Returns a new dict without the per-expert
    entries, so the caller's per-expert tensors can be freed; `expert_views` puts them back as views."""
    out, experts = {}, {}
    for name, t in w.items():
        parts = name.split(".")
        if len(parts) == 7 and parts[3] == "experts" and parts[4].isdigit():
            prefix = ".".join(parts[:4])  # layers.{i}.ffn.experts
            experts.setdefault(prefix, {})[(int(parts[4]), parts[5], parts[6])] = t
        else:
            out[name] = t
    for prefix, d in experts.items():
        ids = sorted({e for e, _, _ in d})
        for kind in ("weight", "scale"):
            out[f"{prefix}.w13.{kind}"] = torch.stack([torch.cat([d[e, "w1", kind], d[e, "w3", kind]]) for e in ids])
            out[f"{prefix}.w2.{kind}"] = torch.stack([d[e, "w2", kind] for e in ids])
        out[f"{prefix}.ids"] = torch.tensor(ids, dtype=torch.int64)
    return out


def expert_views(w: Weights) -> None:
    """In place: `{p}.experts.{e}.{w1,w2,w3}.{weight,scale}` as views of the stacks (ops.moe and the EP exact mode
    read experts one by one; views cost no memory)."""
    for name in [n for n in w if n.endswith(".experts.ids")]:
        prefix = name[: -len(".ids")]
        for g, e in enumerate(w[name].tolist()):
            for kind in ("weight", "scale"):
                w13 = w[f"{prefix}.w13.{kind}"][g]
                half = w13.shape[0] // 2
                w[f"{prefix}.{e}.w1.{kind}"], w[f"{prefix}.{e}.w3.{kind}"] = w13[:half], w13[half:]
                w[f"{prefix}.{e}.w2.{kind}"] = w[f"{prefix}.w2.{kind}"][g]


# --------------------------------------------------------------------------- layout
@dataclass
class ExpertRows:
    """Where each (token, slot) pair of one MoE call lives in the expert-sorted row space (all on the device).

    Contiguous form: grouped_layout int32 [M] expert (group) of each row, -1 for padding, masked_m None.
    Masked form: M = E * max_m rows, expert e owning rows [e * max_m, e * max_m + masked_m[e]); grouped_layout
    None, masked_m int32 [E].
    Both: row_token int64 [M] token of each row (0 for padding: gathered but never stored); row_weight fp32 [M]
    routing weight (0 for padding); pair_row int64 [T, k] the row of each (token, slot), its slots sorted by
    ascending expert id; expected_m the typical rows per touched expert, the GEMMs' tile-height hint (the
    contiguous form's M is a fixed capacity, whose spare rows would mislead an estimate from M)."""

    grouped_layout: torch.Tensor | None
    row_token: torch.Tensor
    row_weight: torch.Tensor
    pair_row: torch.Tensor
    masked_m: torch.Tensor | None = None
    expected_m: int = 0


def max_rows(num_pairs: int, num_groups: int, align: int) -> int:
    """Rows the contiguous layout needs at most: every pair, plus < align padding rows per non-empty expert."""
    return -(-(num_pairs + min(num_groups, num_pairs) * (align - 1)) // align) * align


def contiguous_plan(idx: torch.Tensor, wt: torch.Tensor, num_groups: int) -> ExpertRows:
    """idx: int64 [T, k] group ids (distinct per token), wt: fp32 [T, k]. Device ops only, fixed output sizes."""
    return _plan(idx, wt, num_groups, masked=False)


def masked_plan(idx: torch.Tensor, wt: torch.Tensor, num_groups: int) -> ExpertRows:
    """As contiguous_plan, in the masked form: T rows reserved per expert (a token meets an expert at most once)."""
    return _plan(idx, wt, num_groups, masked=True)


def _plan(idx: torch.Tensor, wt: torch.Tensor, num_groups: int, masked: bool) -> ExpertRows:
    """The single-process case of mini-deepep's receive layout: every expert is local and the tokens are this
    step's own, in order, so `plan_expert_segments` places the pairs (a stable sort by expert: tokens ascend inside
    an expert, as in ops.moe), at a fixed row count so nothing is read back to the host."""
    T, k = idx.shape
    expected_m = max(1, -(-T * k // min(num_groups, T * k))) if T else 1
    if masked:  # packed segments (alignment 1), then each expert's rank-th pair moved to row e * T + rank
        if moe_kernels.available(idx):  # the same layout in four launches
            row_token, row_weight, pair_row, masked_m = moe_kernels.masked_plan(idx, wt, num_groups)
            return ExpertRows(None, row_token, row_weight, pair_row, masked_m, expected_m)
        seg = plan_expert_segments(idx, num_groups, 1, num_rows=T * k)
        counts = seg.num_tokens_per_expert.long()
        rank = seg.positions.long() - (torch.cumsum(counts, 0) - counts)[idx]
        row, M, grouped_layout = idx * T + rank, num_groups * T, None
    else:
        align = get_m_alignment_for_contiguous_layout()
        M = max_rows(T * k, num_groups, align)
        if moe_kernels.available(idx):  # the same layout in four launches
            grouped_layout, row_token, row_weight, pair_row = moe_kernels.contiguous_plan(idx, wt, num_groups, align, M)
            return ExpertRows(grouped_layout, row_token, row_weight, pair_row, expected_m=expected_m)
        seg = plan_expert_segments(idx, num_groups, align, num_rows=M)
        row, grouped_layout = seg.positions.long(), seg.grouped_layout
    row_token = scatter_rows_values(row, torch.arange(T, device=idx.device)[:, None].expand(T, k), M, 0)
    row_weight = scatter_rows_values(row, wt.float(), M, 0.0)
    pair_row = row.gather(1, idx.argsort(dim=1))  # each token's slots by ascending expert id
    if masked:
        return ExpertRows(None, row_token, row_weight, pair_row, seg.num_tokens_per_expert, expected_m)
    return ExpertRows(grouped_layout, row_token, row_weight, pair_row, expected_m=expected_m)


def folds_activations(w: Weights, name: str) -> bool:
    """Whether the activations of stacked expert weight `name` (`{p}.experts.w13` / `.w2`) are quantized folded per
    128: when its GEMMs take the FP8-MMA route (module docstring)."""
    return isinstance(w, ops.KernelWeights) and f"{name}.scale" in w.fp4_folded


# --------------------------------------------------------------------------- elementwise steps (torch references)
def quant_gather_torch(x: torch.Tensor, row_token: torch.Tensor, fold_128: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The T token rows quantized once (per-row quantization commutes with the row gather, so this is bit-identical
    to quantizing each expert's gathered rows), then gathered into the layout: (e4m3 [M, D], UE8M0 [M, D/32], or
    with fold_128 fp32 [M, D/128])."""
    xq, xs = per_token_group_quant_fp8(x.contiguous(), QUANT_BLOCK, "ue8m0", fold_128=fold_128)
    return ops.gather_rows(xq, row_token), ops.gather_rows(xs, row_token)


def swiglu_weight_quant_torch(h13: torch.Tensor, row_weight: torch.Tensor, limit: float, fold_128: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Clamped SwiGLU of h13 bf16 [M, 2I] (gate | up) times the routing weight, in fp32, rounded to bf16, then
    w2's activation quant (as ops.swiglu_expert): (e4m3 [M, I], UE8M0 [M, I/32], or with fold_128 fp32
    [M, I/128])."""
    inter = h13.shape[1] // 2
    h = F.silu(h13[:, :inter].float().clamp(max=limit)) * h13[:, inter:].float().clamp(-limit, limit)
    h = (row_weight[:, None] * h).to(torch.bfloat16)
    return per_token_group_quant_fp8(h, QUANT_BLOCK, "ue8m0", fold_128=fold_128)


def combine_torch(out: torch.Tensor, pair_row: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """bf16 [T, D]: each token's k expert outputs (out[pair_row[t, j]], j in ascending expert id, ops.moe's
    index_add_ order) added in fp32, then the shared expert, then one bf16 cast."""
    y = torch.zeros(shared.shape, dtype=torch.float32, device=shared.device)
    for j in range(pair_row.shape[1]):
        y += out[pair_row[:, j]].float()
    y += shared.float()
    return y.to(torch.bfloat16)


# --------------------------------------------------------------------------- compute
def grouped_expert_ffn(a: tuple[torch.Tensor, torch.Tensor], row_weight: torch.Tensor, w: Weights, p: str,
                       cfg: V41Config, grouped_layout: torch.Tensor | None = None,
                       masked_m: torch.Tensor | None = None, expected_m: int = 0,
                       real_rows: torch.Tensor | None = None) -> torch.Tensor:
    """The routed experts on expert-sorted rows. a: (e4m3 [M, D], UE8M0 scales [M, D/32], or fp32 [M, D/128] when
    folds_activations(w, w13)) quantized rows;
    row_weight: fp32 [M]; the rows' experts (groups = indices into the layer's stacked experts) as either
    grouped_layout int32 [M] (contiguous, -1 padding) or masked_m int32 [E] with M = E * max_m (masked).
    expected_m: the typical rows per touched expert (ExpertRows.expected_m), the GEMMs' tile-height hint; 0 (a
    contiguous layout of just its segments, e.g. mini-deepep's dispatch) lets the GEMM estimate it from M.
    real_rows: indices of the non-padding rows (ExpertRows.pair_row), which the fused SwiGLU's grid covers; needed
    with the masked layout on CUDA, optional with the contiguous one (else its grid covers every row of the
    layout). Returns bf16 [M, D], each row weighted by its routing weight; padding rows are unspecified."""
    M = row_weight.shape[0]
    w13, w2 = f"{p}.experts.w13", f"{p}.experts.w2"
    inter = w[f"{w13}.weight"].shape[1] // 2
    D = w[f"{w2}.weight"].shape[1]

    def gemm(x: tuple[torch.Tensor, torch.Tensor], name: str, n: int) -> torch.Tensor:
        out = torch.empty(M, n, dtype=torch.bfloat16, device=row_weight.device)
        b = (w[f"{name}.weight"], w[f"{name}.scale"])
        # the same bound and route for both layouts, so a token's rows get the same bits in prefill and decode
        kernel_weights = isinstance(w, ops.KernelWeights)
        bound = w.fp4_scale_max.get(f"{name}.scale", 255) if kernel_weights else 255
        folded = w.fp4_folded.get(f"{name}.scale") if kernel_weights else None
        if masked_m is None:
            m_grouped_fp8_fp4_gemm_nt_contiguous(x, b, out, grouped_layout, weight_scale_max=bound, folded=folded,
                                                 expected_m=expected_m or None)
        else:
            G = masked_m.shape[0]
            shaped = tuple(t.view(G, M // G, t.shape[-1]) for t in x)
            m_grouped_fp8_fp4_gemm_nt_masked(shaped, b, out.view(G, M // G, n), masked_m, expected_m,
                                             weight_scale_max=bound, folded=folded)
        return out

    h13 = gemm(a, w13, 2 * inter)
    fold = folds_activations(w, w2)
    if moe_kernels.available(h13):  # padding rows of hq stay unwritten: the w2 GEMM skips them
        listed = real_rows is not None
        hq = moe_kernels.swiglu_weight_quant(h13, row_weight, cfg.swiglu_limit, None if listed else grouped_layout,
                                             real_rows, fold_128=fold)
    else:
        hq = swiglu_weight_quant_torch(h13, row_weight, cfg.swiglu_limit, fold)
    return gemm(hq, w2, D)


def shared_expert(x: torch.Tensor, w: Weights, p: str, cfg: V41Config) -> torch.Tensor:
    """ops.swiglu_expert(x, w, f"{p}.shared_experts", cfg): bf16 [T, D]. For the engine model on CUDA (the stacked
    `{p}.shared_experts.w13` of ops.KernelWeights) x is quantized once and one GEMM computes w1 and w3 (2I columns:
    one launch and twice the tiles of one half), then the clamped SwiGLU and w2's activation quantization run as
    one kernel (moe_kernels.swiglu_weight_quant, every row real, unweighted) instead of the torch chain's fp32
    passes. The stacked GEMM takes the route a half's own call would (route_of w1): at 2I columns it would cross
    DENSE_FOLD_MIN_TILES at fewer rows (300 rows: the V3-recipe route against the V4.1 one, calc_diff 1.5e-5 at the
    output, session 31 run 1), so the same operations run on the same values as the two-GEMM chain."""
    e = f"{p}.shared_experts"
    if not (moe_kernels.available(x) and isinstance(w, ops.KernelWeights) and f"{e}.w13.weight" in w):
        return ops.swiglu_expert(x, w, e, cfg)
    h13 = ops.linear(x, w, f"{e}.w13", route_of=f"{e}.w1")
    v3_form = ops.dense_v3_form(x.shape[0], w, f"{e}.w2")
    hq = moe_kernels.swiglu_weight_quant(h13, None, cfg.swiglu_limit, fold_128=v3_form)
    return ops.quantized_linear(hq, x.shape[0], w, f"{e}.w2", v3_form)


def moe_grouped(x: torch.Tensor, w: Weights, p: str, cfg: V41Config) -> torch.Tensor:
    """ops.moe on stacked experts (stack_experts), as two grouped GEMMs with no host sync. x bf16 [T, D].
    Up to MASKED_MAX_TOKENS tokens (decode) in the masked layout, above in the contiguous one."""
    idx, wt = ops.moe_route(x, w, p, cfg)
    num_groups = w[f"{p}.experts.w13.weight"].shape[0]
    plan = (masked_plan if x.shape[0] <= MASKED_MAX_TOKENS else contiguous_plan)(idx, wt, num_groups)
    fused = moe_kernels.available(x)
    fold = folds_activations(w, f"{p}.experts.w13")
    if fused:
        a = moe_kernels.quant_scatter(x, plan.pair_row, plan.row_weight.shape[0], fold)
    else:
        a = quant_gather_torch(x, plan.row_token, fold)
    out = grouped_expert_ffn(a, plan.row_weight, w, p, cfg, plan.grouped_layout, plan.masked_m, plan.expected_m,
                             plan.pair_row)
    shared = shared_expert(x, w, p, cfg)
    return (moe_kernels.combine if fused else combine_torch)(out, plan.pair_row, shared)
