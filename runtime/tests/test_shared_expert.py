"""The shared expert on the engine's fused path (moe.shared_expert): ops.KernelWeights stacks its w1 and w3 into one
`w13` weight (w1 and w3 left as views of the halves), and on CUDA moe.shared_expert runs one GEMM for both halves and
the fused SwiGLU + quantization (layers/moe_kernels.py, every row real, unweighted).

Metrics: the stacked tensors are byte-equal to the halves they replace (CPU). On the GPU, at V4.1-Flash's widths
(hidden 5,120, intermediate 2,304) and 1 to 4,096 rows, moe.shared_expert against ops.swiglu_expert on the same
KernelWeights (two GEMMs, the torch SwiGLU chain, w2's own activation quantization): calc_diff < 1e-6 (the same
operations; bit-identical wherever the stacked GEMM gives each element the bits of the half GEMM; the equal
fraction is printed).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mini_deepgemm.testing import calc_diff, random_bf16, random_fp8_weights

from mini_deepinfer.models.deepseek_v41 import moe, ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

P = "layers.0.ffn"


def shared_expert_weights(hidden: int, inter: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = {}
    for name, (n, k) in {"w1": (inter, hidden), "w3": (inter, hidden), "w2": (hidden, inter)}.items():
        _, q, s = random_fp8_weights(N=n, K=k, block=32, scale_fmt="ue8m0", generator=gen)
        w[f"{P}.shared_experts.{name}.weight"], w[f"{P}.shared_experts.{name}.scale"] = q, s
    return w


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "as-loaded"])
def test_kernel_weights_stack_w1_and_w3_as_bytes_and_keep_views(fold):
    w = shared_expert_weights(256, 384)
    kw = ops.KernelWeights(w, fold_dense_fp8=fold)
    e = f"{P}.shared_experts"
    kinds = ["weight", "scale"] + (["scale_128"] if fold else [])
    assert (f"{e}.w13.scale_128" in kw) == fold
    for k in kinds:
        w13, w1, w3 = kw[f"{e}.w13.{k}"], kw[f"{e}.w1.{k}"], kw[f"{e}.w3.{k}"]
        assert w13.dtype == w1.dtype and w13.shape[0] == 2 * w1.shape[0]
        raw = (lambda t: t.view(torch.uint8)) if w1.element_size() == 1 else (lambda t: t)
        assert torch.equal(raw(w13), torch.cat([raw(w1), raw(w3)]))
        assert w1.data_ptr() == w13.data_ptr() and w3.data_ptr() == w13[w1.shape[0]:].data_ptr(), "views, no copy"
    if not fold:  # as loaded: the halves are the checkpoint's bytes
        assert torch.equal(kw[f"{e}.w3.weight"].view(torch.uint8), w[f"{e}.w3.weight"].view(torch.uint8))
    kw[f"{e}.w1.weight"] = kw[f"{e}.w1.weight"].clone()
    assert not any(n.startswith(f"{e}.w13.") for n in kw), "replacing w1 drops the stale stack"


def test_unmatched_halves_are_not_stacked():
    w = shared_expert_weights(256, 384)
    w[f"{P}.shared_experts.w3.weight"] = w[f"{P}.shared_experts.w3.weight"][:256]
    w[f"{P}.shared_experts.w3.scale"] = w[f"{P}.shared_experts.w3.scale"][:8]
    assert f"{P}.shared_experts.w13.weight" not in ops.KernelWeights(w, fold_dense_fp8=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_shared_expert_matches_the_two_gemm_chain_at_v41_widths():
    cfg = V41Config()
    kw = ops.KernelWeights({k: v.cuda() for k, v in
                            shared_expert_weights(cfg.hidden_size, cfg.moe_intermediate_size, seed=5).items()})
    x = random_bf16(4096, cfg.hidden_size, generator=torch.Generator().manual_seed(5)).cuda()
    for rows in (1, 64, 65, 300, 4096):  # the V4.1 kernels below DENSE_FOLD_MIN_TILES, the V3-recipe ones from it
        got = moe.shared_expert(x[:rows], kw, P, cfg)
        want = ops.swiglu_expert(x[:rows], kw, f"{P}.shared_experts", cfg)
        assert got.shape == want.shape == (rows, cfg.hidden_size) and torch.isfinite(got).all()
        diff = calc_diff(got.float(), want.float())
        print(f"shared expert, {rows} rows: {100 * (got == want).float().mean().item():.4f}% equal, "
              f"calc_diff {diff:.2e}")
        assert diff < 1e-6, rows
    assert moe.shared_expert(x[:0], kw, P, cfg).shape == (0, cfg.hidden_size)


def test_shared_expert_falls_back_to_the_torch_chain_off_cuda():
    cfg = dataclasses.replace(V41Config(), hidden_size=256, moe_intermediate_size=384)
    kw = ops.KernelWeights(shared_expert_weights(256, 384, seed=2))
    x = random_bf16(7, 256, generator=torch.Generator().manual_seed(2))
    assert torch.equal(moe.shared_expert(x, kw, P, cfg), ops.swiglu_expert(x, kw, f"{P}.shared_experts", cfg))
