"""layers/moe_route.py: the routing kernel against the torch chain (ops.moe_route_from_scores, its reference) on the
same fp32 gate scores, and ops.moe_route on the kernels (KernelWeights on CUDA) against the reference path.

Runs on CUDA (marked gpu), and on CPU under the Triton interpreter when TRITON_INTERPRET=1 is set (smaller cases;
CPU CI runs this file that way through the last test). Scores are random, never all zeros, with columns past the
softplus threshold (> 20) and far below zero (s ~ 0), and ties made on purpose (equal columns with equal biases,
rows with every expert equal).

Metrics:
- ids: equal to the stable descending sort of the reference's biased scores (the kernel's rule: ties to the lower
  expert id), and tie-aware to torch.topk: the same biased values in the same (descending) order, the same ids
  wherever the value is not tied;
- weights: within rtol 1e-6 of the chain's (the kernel sums the k weights in slot order, torch in its own order; on
  the interpreter exp / log1p are numpy's, within a few ulps of torch's), atol 1e-12 for weights from subnormal
  exp(z) (z < -87.3; CPU torch and numpy round those differently); on CUDA, with the chain's k-sum taken in slot
  order, bit-identical;
- planes: routing from split-K planes equals routing from their sum, bit for bit;
- ops.moe_route with KernelWeights on CUDA (split-K gate + kernel) against the plain-dict reference (fp32 matmul +
  torch chain): the same ids, weights within rtol 1e-5 (the gate's fp32 sums are ordered differently, ~1e-7).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mini_deepinfer.layers import linear_fp32 as lf
from mini_deepinfer.layers import moe_route as mr
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

from kernel_devices import DEVICE, INTERPRET, interpreter_child, kernel_test, run_under_interpreter, sum_in_order

pytestmark = pytest.mark.skipif(mr.triton is None, reason="needs triton")


# (T, E, k): V4.1's 384 experts top-6, a small E (8, a power of two), E not a power of two, k = E, k = 1
CASES = [(0, 384, 6), (1, 384, 6), (7, 384, 6), (64, 384, 6), (200, 8, 6), (64, 13, 6), (7, 6, 6), (9, 5, 1)]
if DEVICE == "cuda":
    CASES += [(200, 384, 6), (4096, 384, 6), (33, 512, 8), (17, 1000, 6)]


def _cfg(k: int, gate_temp: float = 1.0) -> V41Config:
    return V41Config(num_experts_per_tok=k, gate_temp=gate_temp)


def _scores(T: int, E: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate scores fp32 [T, E] ~ N(0, 3^2), with a quarter of the columns scaled x 12 (past +-20: softplus's
    threshold above, s ~ 0 below), and a bias fp32 [E] ~ N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g) * 3
    scores[:, torch.randperm(E, generator=g)[: max(E // 4, 1)]] *= 12
    return scores, torch.randn(E, generator=g) * 0.3


def _biased(scores: torch.Tensor, bias: torch.Tensor, gate_temp: float = 1.0) -> torch.Tensor:
    """The reference's biased scores: the chain's first steps, on the same device."""
    return F.softplus(scores / gate_temp).sqrt() + bias.float()


def _assert_routing(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
                    biased: torch.Tensor, rtol: float = 1e-6) -> None:
    """got: the kernel's (ids, weights); want: the torch chain's; biased: the reference's biased scores [T, E]."""
    (idx, wt), (ref_idx, ref_wt) = [(i.cpu(), w.cpu()) for i, w in (got, want)]
    biased = biased.cpu()
    assert idx.dtype == torch.int64 and wt.dtype == torch.float32 and idx.shape == wt.shape == ref_idx.shape
    k = idx.shape[1]
    # the kernel's rule: descending, ties to the lower id = a stable descending sort
    rule = torch.sort(biased, dim=1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(idx, rule), (idx != rule).nonzero()[:5]
    # tie-aware against torch.topk: the same values in the same order; the same id wherever the value is unique
    got_v, ref_v = biased.gather(1, idx), biased.gather(1, ref_idx)
    assert torch.equal(got_v, ref_v)
    unique = (biased[:, None, :] == got_v[:, :, None]).sum(-1) == 1
    assert torch.equal(idx[unique], ref_idx[unique])
    # atol: for z < -87.3 exp(z) is subnormal in fp32 (few significant bits), and CPU torch and numpy (the
    # interpreter) may round it differently: weights ~1e-22 and below, nothing next to the O(0.1) ones of their row
    torch.testing.assert_close(wt, ref_wt, rtol=rtol, atol=1e-12)


@kernel_test
@pytest.mark.parametrize("T,E,k", CASES)
def test_kernel_matches_the_torch_chain(T: int, E: int, k: int) -> None:
    scores, bias = _scores(T, E, seed=T * 1009 + E)
    cfg = _cfg(k)
    want = ops.moe_route_from_scores(scores, bias, cfg)
    scores, bias = scores.to(DEVICE), bias.to(DEVICE)
    got = mr.route_from_planes(scores, bias, k, cfg.gate_temp, cfg.routed_scaling_factor)
    _assert_routing(got, want, _biased(scores.cpu(), bias.cpu()))
    if DEVICE == "cuda":  # against the chain on the same device
        on_device = ops.moe_route_from_scores(scores, bias, cfg)
        _assert_routing(got, on_device, _biased(scores, bias))
        equal = (got[1] == on_device[1]).float().mean().item() if T else 1.0
        print(f"T={T} E={E} k={k}: weights bit-identical to the CUDA chain: {100 * equal:.2f}%")
        _assert_bitwise_with_the_kernels_sum_order(got, scores, bias, cfg)


def _assert_bitwise_with_the_kernels_sum_order(got: tuple[torch.Tensor, torch.Tensor], scores: torch.Tensor,
                                               bias: torch.Tensor, cfg: V41Config) -> None:
    """CUDA: the chain's s (libdevice expf / log1pf as torch's CUDA softplus calls them, subnormals kept, sqrt and
    divisions rounded to nearest) is the kernel's bit for bit, so with the k weights summed in the kernel's slot
    order the weights are equal too (the _scores put many picks past both softplus thresholds, and below -87.3,
    where exp(z) is subnormal)."""
    idx, wt = got
    s = F.softplus(scores / cfg.gate_temp).sqrt()
    picked = s.gather(1, idx)
    total = torch.zeros(idx.shape[0], device=idx.device)
    for i in range(idx.shape[1]):
        total = total + picked[:, i]
    slot_order = picked / (total[:, None] + 1e-20) * cfg.routed_scaling_factor
    assert torch.equal(wt, slot_order)


@kernel_test
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_ties_take_the_lower_expert_id(bias_dtype: torch.dtype) -> None:
    """Equal columns with equal biases (tied biased scores and equal s) inside the top k and across its edge, and
    rows where every expert ties."""
    T, E, k = 6, 384, 6
    scores, bias = _scores(T, E, seed=7)
    bias = bias.to(bias_dtype)
    for t in range(T):
        scores[t, 300:303] = scores[t, 5]  # a tie group of four (5, 300, 301, 302) at a random rank
        scores[t, [40, 41, 200]] = scores[t].max() + 1.0  # three tied at the top
    bias[300:303] = bias[5].item()
    bias[[40, 41, 200]] = 0.25
    scores[1, 100:110] = scores[1].max() + 60.0  # ten tied at the top: the edge of the top 6 falls inside them
    bias[100:110] = 0.0
    scores[2] = 0.5  # every score equal: the bias alone orders, its equal entries tie ...
    scores[3] = -30.0  # ... and with s ~ 0
    cfg = _cfg(k)
    want = ops.moe_route_from_scores(scores, bias, cfg)
    got = mr.route_from_planes(scores.to(DEVICE), bias.to(DEVICE), k, cfg.gate_temp, cfg.routed_scaling_factor)
    _assert_routing(got, want, _biased(scores, bias))
    assert got[0][1].tolist() == list(range(100, 106))
    if DEVICE == "cuda":
        _assert_bitwise_with_the_kernels_sum_order(got, scores.cuda(), bias.cuda(), cfg)


@kernel_test
def test_gate_temperature_and_all_equal_biases() -> None:
    """gate_temp != 1 (an IEEE division in the kernel: torch on CUDA multiplies by the reciprocal, so only the
    tolerances hold), and a zero bias, where the order comes from s alone."""
    scores, _ = _scores(33, 384, seed=11)
    bias = torch.zeros(384)
    cfg = _cfg(6, gate_temp=0.7)
    want = ops.moe_route_from_scores(scores, bias, cfg)
    got = mr.route_from_planes(scores.to(DEVICE), bias.to(DEVICE), 6, cfg.gate_temp, cfg.routed_scaling_factor)
    _assert_routing(got, want, _biased(scores, bias, cfg.gate_temp), rtol=2e-6)


@kernel_test
@pytest.mark.parametrize("T", [1, 64])
def test_routing_from_planes_equals_routing_from_their_sum(T: int) -> None:
    """The kernel adds the split-K planes in linear_fp32's order: routing from the planes = routing from their
    in-order sum, bit for bit; moe_route_fused = planes of GATE_K_SLICE, then the route."""
    g = torch.Generator().manual_seed(T)
    D, E = 1536 if INTERPRET else 5120, 384
    x = torch.randn(T, D, generator=g).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(E, D, generator=g) * D**-0.5).to(torch.bfloat16).to(DEVICE)
    bias = (torch.randn(E, generator=g) * 0.3).to(DEVICE)
    planes = lf.linear_fp32_planes(x, w, mr.GATE_K_SLICE, split=True)
    assert planes.shape == (D // mr.GATE_K_SLICE, T, E)
    from_planes = mr.route_from_planes(planes, bias, 6, 1.0, 1.5)
    from_sum = mr.route_from_planes(sum_in_order(planes), bias, 6, 1.0, 1.5)
    assert all(torch.equal(a, b) for a, b in zip(from_planes, from_sum))
    fused = mr.moe_route_fused(x, w, bias, 6, 1.0, 1.5)
    assert all(torch.equal(a, b) for a, b in zip(fused, from_planes))


def test_bad_arguments_are_rejected() -> None:
    scores = torch.zeros(3, 8)
    for k, bias in ((0, torch.zeros(8)), (9, torch.zeros(8)), (2, torch.zeros(7))):
        with pytest.raises(ValueError, match="route_from_planes"):
            mr.route_from_planes(scores, bias, k, 1.0, 1.5)


def _gate(T: int, seed: int, device: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    cfg = V41Config()
    D, E = cfg.hidden_size, cfg.n_routed_experts
    x = torch.randn(T, D, generator=g).to(torch.bfloat16)
    w = {"l.gate.weight": (torch.randn(E, D, generator=g) * D**-0.5).to(torch.bfloat16),
         "l.gate.bias": torch.randn(E, generator=g) * 0.01}
    return x.to(device), {n: t.to(device) for n, t in w.items()}


def test_cpu_engine_weights_keep_the_torch_chain() -> None:
    """KernelWeights off CUDA: the reference path, bit for bit."""
    x, w = _gate(5, seed=1, device="cpu")
    got = ops.moe_route(x, ops.KernelWeights(w), "l", V41Config())
    want = ops.moe_route(x, w, "l", V41Config())
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 7, 64, 200, 4096])
def test_engine_route_matches_the_reference_route(T: int) -> None:
    cfg = V41Config()
    x, w = _gate(T, seed=T, device="cuda")
    kw = ops.KernelWeights(w)
    got = ops.moe_route(x, kw, "l", cfg)
    kernels = mr.moe_route_fused(x, w["l.gate.weight"], w["l.gate.bias"], 6, cfg.gate_temp, cfg.routed_scaling_factor)
    assert all(torch.equal(a, b) for a, b in zip(got, kernels))  # the engine path takes the kernels
    want = ops.moe_route(x, w, "l", cfg)
    biased = _biased(ops.fp32_matmul(x, w, "l.gate.weight"), w["l.gate.bias"])
    (idx, wt), (ref_idx, ref_wt) = got, want
    assert torch.equal(idx, ref_idx), (idx != ref_idx).nonzero()[:5]  # random scores: no ties, no near-ties
    torch.testing.assert_close(wt, ref_wt, rtol=1e-5, atol=0)
    assert torch.equal(biased.gather(1, idx), biased.gather(1, ref_idx))


@interpreter_child
def test_kernels_run_under_the_triton_interpreter_on_cpu() -> None:
    """CI has no GPU: run this file's kernel tests once under TRITON_INTERPRET=1."""
    run_under_interpreter(__file__)
