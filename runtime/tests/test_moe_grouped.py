"""The engine's grouped MoE (models/deepseek_v41/moe.py) against its oracle ops.moe, and its routing layouts
(contiguous above MASKED_MAX_TOKENS tokens, masked up to it).

Metrics: the layout is checked exactly (every (token, slot) pair in its expert's 128-aligned segment, padding -1,
the row space within max_rows); moe_grouped vs ops.moe: on CPU both run the pure-torch GEMM references, so only
the fp32 GEMM sums may differ in order (max |diff| <= 1 bf16 ulp of the output scale, relative L2 < 1e-3); on CUDA
the mini-deepgemm kernels: relative L2 < 1e-2 (bf16 rounding of h13/h in another order flips FP8 roundings of h),
and the forward runs under torch.cuda.set_sync_debug_mode("error"), i.e. without a host synchronisation.
"""

from __future__ import annotations

import math

import pytest
import torch
from mini_deepgemm.reference import fp4_to_fp8_mma_order

from mini_deepinfer.models.deepseek_v41 import load_checkpoint, moe, ops, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.model import engine_weights
from mini_deepinfer.models.deepseek_v41.moe import contiguous_plan, masked_plan, max_rows


def _routing(T: int, k: int, E: int, seed: int, skew: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    if skew:  # a few hot experts, many empty ones
        logits[:, : E // 4] += 4.0
    idx = logits.topk(k, dim=1).indices
    return idx, torch.rand(T, k, generator=g)


@pytest.mark.parametrize("T,k,E,skew", [(0, 6, 32, False), (1, 6, 32, False), (7, 6, 32, True), (300, 6, 32, False),
                                        (513, 2, 8, True), (129, 6, 384, False)])
def test_contiguous_plan_places_every_pair_in_its_experts_aligned_segment(T, k, E, skew) -> None:
    idx, wt = _routing(T, k, E, seed=T + E, skew=skew)
    plan = contiguous_plan(idx, wt, E)
    layout = plan.grouped_layout
    assert layout.shape == (max_rows(T * k, E, 128),) and layout.dtype == torch.int32
    rows = plan.pair_row
    assert rows.shape == (T, k)
    # each pair's row holds its expert, token and weight; slots are sorted by expert id
    got_expert = layout[rows].long()
    assert torch.equal(got_expert, idx.sort(dim=1).values)
    assert torch.equal(plan.row_token[rows], torch.arange(T)[:, None].expand(T, k))
    assert torch.equal(plan.row_weight[rows], wt.gather(1, idx.argsort(dim=1)))
    # rows are distinct; everything else is padding with weight 0
    assert rows.unique().numel() == T * k
    pad = torch.ones(layout.shape[0], dtype=torch.bool)
    pad[rows.flatten()] = False
    assert bool((layout[pad] == -1).all()) and bool((plan.row_weight[pad] == 0).all())
    # segments: each expert's rows are contiguous, start at a multiple of 128, tokens ascending inside
    for e in idx.unique().tolist():
        r = (layout == e).nonzero().squeeze(1)
        assert r[0] % 128 == 0 and torch.equal(r, torch.arange(r[0], r[0] + r.numel()))
        assert bool((plan.row_token[r].diff() > 0).all())
    # the GEMMs' tile hint: pairs per touched expert, not the fixed capacity's rows per expert
    assert plan.expected_m == (max(1, -(-T * k // min(E, T * k))) if T else 1)


@pytest.mark.parametrize("T,k,E,skew", [(0, 6, 32, False), (1, 6, 32, False), (7, 6, 32, True), (64, 6, 384, False)])
def test_masked_plan_places_every_pair_in_its_experts_rows(T, k, E, skew) -> None:
    idx, wt = _routing(T, k, E, seed=T + E + 1, skew=skew)
    plan = masked_plan(idx, wt, E)
    assert plan.grouped_layout is None and plan.row_token.shape == (E * T,)
    counts = torch.bincount(idx.flatten(), minlength=E)
    assert torch.equal(plan.masked_m, counts.to(torch.int32))
    rows = plan.pair_row
    # expert e owns rows [e*T, e*T + count_e), tokens ascending; each pair's row holds its token and weight
    assert torch.equal(rows // max(T, 1), idx.sort(dim=1).values) if T else rows.numel() == 0
    assert torch.equal(plan.row_token[rows], torch.arange(T)[:, None].expand(T, k))
    assert torch.equal(plan.row_weight[rows], wt.gather(1, idx.argsort(dim=1)))
    for e in idx.unique().tolist():
        own = torch.arange(e * T, e * T + int(counts[e]))
        assert bool((plan.row_token[own].diff() > 0).all()) and bool((plan.row_weight[own] > 0).all())
    assert plan.row_weight.count_nonzero() == T * k


@pytest.fixture(scope="module")
def tiny_weights():
    cfg, w = load_checkpoint(resolve_checkpoint("tiny"))
    return cfg, w


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _bf16_ulp(x: float) -> float:
    """The spacing of bf16 values (8 significant bits) at magnitude x > 0."""
    return 2.0 ** (math.floor(math.log2(x)) - 7)


@pytest.mark.parametrize("T", [0, 1, 37, 64, 65, 300])
def test_grouped_moe_equals_the_per_expert_oracle_on_cpu(tiny_weights, T) -> None:
    cfg, w = tiny_weights
    ws = engine_weights(w, "cpu")
    x = (torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(T)) * 0.5).to(torch.bfloat16)
    for lid in (0, 3):
        p = f"layers.{lid}.ffn"
        want = ops.moe(x, w, p, cfg)
        got = moe.moe_grouped(x, ws, p, cfg)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        if T:
            assert _rel_l2(got, want) < 1e-3, (lid, _rel_l2(got, want))
            diff = float((got.float() - want.float()).abs().max())
            assert diff <= _bf16_ulp(float(want.float().abs().max())), (lid, diff)  # measured: 0 (bit-identical)


def test_expert_views_share_the_stacks(tiny_weights) -> None:
    cfg, w = tiny_weights
    ws = engine_weights(w, "cpu")
    p = "layers.2.ffn.experts"
    for e in (0, cfg.n_routed_experts - 1):
        for name in ("w1", "w2", "w3"):
            for kind in ("weight", "scale"):
                view, orig = ws[f"{p}.{e}.{name}.{kind}"], w[f"{p}.{e}.{name}.{kind}"]
                assert torch.equal(view.view(torch.uint8), orig.view(torch.uint8))
    assert ws[f"{p}.0.w1.weight"].untyped_storage().data_ptr() == ws[f"{p}.w13.weight"].untyped_storage().data_ptr()


def test_kernel_weights_bound_each_expert_scale_stack(tiny_weights) -> None:
    """KernelWeights reads each stacked FP4 expert scale tensor's largest byte once, the bound the grouped GEMMs
    get (their folded conversion needs <= 128, which the checkpoint's amax / 6 scales give); replacing a tensor
    drops its bound."""
    cfg, w = tiny_weights
    ws = ops.KernelWeights(engine_weights(w, "cpu"))
    scales = [n for n in ws if n.endswith((".experts.w13.scale", ".experts.w2.scale"))]
    assert scales and sorted(ws.fp4_scale_max) == sorted(scales)
    for name in scales:
        assert ws.fp4_scale_max[name] == int(ws[name].view(torch.uint8).max()) <= 128
    ws[scales[0]] = ws[scales[0]].clone()
    assert scales[0] not in ws.fp4_scale_max


def test_kernel_weights_hold_folded_experts_in_the_route_order(tiny_weights) -> None:
    """A folded expert stack and its per-expert views are held in the FP8-MMA route's order, reordered in place (no
    second copy); ops.moe (the oracle, which reads the views one by one) gives the same bits as on the checkpoint's
    order; drop_fp8_mma_route gives the checkpoint's bytes back; a second KernelWeights over the reordered stacks
    raises; a replaced weight leaves the route."""
    cfg, w = tiny_weights
    loaded, p = engine_weights(w, "cpu"), "layers.2.ffn"
    natural = loaded[f"{p}.experts.w13.weight"].clone()
    ws = ops.KernelWeights(loaded)
    stack = ws[f"{p}.experts.w13.weight"]
    assert stack is loaded[f"{p}.experts.w13.weight"] and torch.equal(stack, fp4_to_fp8_mma_order(natural))
    assert f"{p}.experts.w13.scale" in ws.fp4_folded and f"{p}.experts.w13.weight" in ws.fp4_route_order
    for e in (0, cfg.n_routed_experts - 1):
        for name in ("w1", "w2", "w3"):
            view = ws[f"{p}.experts.{e}.{name}.weight"]
            assert f"{p}.experts.{e}.{name}.weight" in ws.fp4_route_order
            assert torch.equal(view, fp4_to_fp8_mma_order(w[f"{p}.experts.{e}.{name}.weight"]))
    assert ws[f"{p}.experts.0.w1.weight"].untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    x = (torch.randn(37, cfg.hidden_size, generator=torch.Generator().manual_seed(3)) * 0.5).to(torch.bfloat16)
    routed = ops.moe(x, ws, p, cfg)
    ws.drop_fp8_mma_route()
    assert not ws.fp4_folded and not ws.fp4_route_order
    for name in (f"{p}.experts.w13.weight", f"{p}.experts.w2.weight", f"{p}.experts.3.w2.weight"):
        assert torch.equal(ws[name], engine_weights(w, "cpu")[name])
    assert torch.equal(ops.moe(x, ws, p, cfg).view(torch.int16), routed.view(torch.int16))
    ws = ops.KernelWeights(engine_weights(w, "cpu"))
    with pytest.raises(ValueError, match="already in the FP8-MMA route's order"):
        ops.KernelWeights(dict(ws))  # the same stacks reordered twice would scramble them
    ws[f"{p}.experts.w2.weight"] = engine_weights(w, "cpu")[f"{p}.experts.w2.weight"]
    assert f"{p}.experts.w2.scale" not in ws.fp4_folded and f"{p}.experts.w2.weight" not in ws.fp4_route_order


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 37, 64, 65, 300, 2048])
def test_grouped_moe_kernels_match_the_oracle_without_host_sync(tiny_weights, T) -> None:
    cfg, w = tiny_weights
    ws = ops.KernelWeights(engine_weights(w, "cuda"))
    x = (torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(T)) * 0.5).to(torch.bfloat16)
    p = "layers.4.ffn"
    want = ops.moe(x, w, p, cfg)
    xd = x.cuda()
    moe.moe_grouped(xd, ws, p, cfg)  # compile the kernels outside the guard
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = moe.moe_grouped(xd, ws, p, cfg)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    again = moe.moe_grouped(xd, ws, p, cfg)
    err = _rel_l2(got.cpu(), want)
    print(f"grouped MoE (CUDA kernels) vs ops.moe (CPU), T={T}: relative L2 {err:.2e}")
    assert err < 1e-2
    assert torch.equal(got, again)  # deterministic: no atomics in the combine
