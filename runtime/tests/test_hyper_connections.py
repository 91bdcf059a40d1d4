"""The fused hyper-connection kernels (layers/hyper_connections.py) against the torch references in ops.py.

Runs on CUDA (marked gpu), and on CPU under the Triton interpreter when TRITON_INTERPRET=1 is set (slow; small
shapes only). Metrics: pre / post / comb (fp32) within 1e-5 absolute of the reference for every tiling in MIXES
(both dot modes, one and several K slices, ragged K; only the projection's K-sum order differs: 4*D = 20,480 fp32
terms summed in another order, ~sqrt(K) * 2^-24 relative to the terms, then sigmoid / Sinkhorn on O(1) values;
the single-program kernel of round 2 measured up to 3.1e-6 on H200); a token's mixes bit-identical whatever batch it
is in (the K slices do not depend on T); collapse / expand (bf16 out) within
one bf16 rounding of the reference: |fused - ref| <= 2^-7 |ref| + 1e-6 (one bf16 ulp), and equal for >= 95% of
the elements on CUDA (the interpreter rounds its bf16 casts toward zero, so there only the 1-ulp bound holds).
Inputs are random (streams of differing scales), never zeros.
"""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config

from kernel_devices import INTERPRET, assert_within_one_rounding, run_under_interpreter

pytestmark = pytest.mark.skipif(hcf.triton is None, reason="needs triton")

if torch.cuda.is_available():
    CASES = [pytest.param("cuda", T, D, marks=pytest.mark.gpu) for T, D in
             ((1, 5120), (17, 5120), (300, 128), (4096, 5120), (33, 4096), (65, 1001))]
elif INTERPRET:
    CASES = [("cpu", T, D) for T, D in ((1, 128), (19, 256))]
else:
    CASES = [pytest.param("cuda", 1, 128, marks=[pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")])]


# the production tiling, the tensor-core dot mode, and a small one with several K slices, the last one ragged.
# The interpreter's tl.dot mis-reads bf16 operands (errors ~1e10 on a 16x16 bf16 dot, triton 3.9), so the bf16x3
# mode is checked on CUDA only.
MIXES = [pytest.param(hcf.DEFAULT_MIX, id="default-bf16x3",
                      marks=pytest.mark.skipif(INTERPRET, reason="interpreter: bf16 tl.dot unsupported")),
         pytest.param(hcf.MixConfig(dot="ieee", block_t=64, block_k=32), id="ieee"),
         pytest.param(hcf.MixConfig(block_t=16, block_k=32, k_slice=96, dot="ieee"), id="small-slices")]


def _inputs(T: int, D: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    H = (torch.randn(T, 4, D, generator=g) * torch.tensor([1.0, 0.5, 2.0, 0.25])[None, :, None]).to(torch.bfloat16)
    fn = torch.randn(24, 4 * D, generator=g) * (4 * D) ** -0.5
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(24, generator=g) * 0.5
    y = torch.randn(T, D, generator=g).to(torch.bfloat16)
    return [t.to(device) for t in (H, fn, scale, base, y)]


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("device,T,D", CASES)
def test_fused_mixes_match_the_reference(device: str, T: int, D: int, mix: hcf.MixConfig) -> None:
    cfg = V41Config() if D == 5120 else tiny_config()
    H, fn, scale, base, _ = _inputs(T, D, device, seed=T + D)
    got = hcf.hc_mixes_fused(H, fn, scale, base, cfg, mix)
    want = ops.hc_mixes(H, fn, scale, base, cfg)
    for name, a, b in zip(("pre", "post", "comb"), got, want):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        err = (a - b).abs().max().item()
        print(f"{name} max abs error vs the reference: {err:.2e}")
        assert err <= 1e-5, (name, err)
    if T > 1:  # the first tokens alone give bit-identical mixes: no dependence on the batch
        alone = hcf.hc_mixes_fused(H[: T // 2].clone(), fn, scale, base, cfg, mix)
        for a, b in zip(alone, got):
            assert torch.equal(a, b[: T // 2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 64, 200])
def test_mixes_do_not_depend_on_the_token_block(T: int) -> None:
    """mix_block_t picks the partial kernel's token block by the call's size, so the batch invariance above needs
    every block to give the same bits (the MMA is mma.sync below 64 rows, wgmma from 64)."""
    cfg = V41Config()
    H, fn, scale, base, _ = _inputs(T, cfg.hidden_size, "cuda", seed=T)
    want = hcf.hc_mixes_fused(H, fn, scale, base, cfg, hcf.MixConfig(block_t=128))
    for block_t in (16, 32, 64, None):
        got = hcf.hc_mixes_fused(H, fn, scale, base, cfg, hcf.MixConfig(block_t=block_t))
        assert all(torch.equal(a, b) for a, b in zip(got, want)), block_t


@pytest.mark.parametrize("device,T,D", CASES)
def test_fused_collapse_and_expand_match_the_references(device: str, T: int, D: int) -> None:
    cfg = V41Config() if D == 5120 else tiny_config()
    H, fn, scale, base, y = _inputs(T, D, device, seed=T + D)
    want = ops.hc_mixes(H, fn, scale, base, cfg)
    assert_within_one_rounding(hcf.hc_collapse_fused(H, want[0]), ops.hc_collapse(H, want[0]))
    expanded = hcf.hc_expand_fused(y, H, want[1], want[2])
    assert_within_one_rounding(expanded, ops.hc_expand(y, H, want[1], want[2]))
    # expand + collapse in one kernel: the same H', and the collapse of exactly those values
    both = hcf.hc_expand_collapse_fused(y, H, want[1], want[2], want[0])
    assert torch.equal(both[0], expanded)
    assert_within_one_rounding(both[1], ops.hc_collapse(expanded, want[0]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_blocks_use_the_fused_ops_and_the_reference_does_not() -> None:
    cfg = tiny_config()
    H = torch.randn(3, 4, cfg.hidden_size, device="cuda").to(torch.bfloat16)
    fused = ops._hc_ops(H, ops.KernelWeights())
    assert fused == (hcf.hc_mixes_fused, hcf.hc_collapse_fused, hcf.hc_expand_collapse_fused)
    assert ops._hc_ops(H, {}) == (ops.hc_mixes, ops.hc_collapse, ops.hc_expand_collapse)


@pytest.mark.skipif(torch.cuda.is_available() or INTERPRET, reason="CUDA runs the kernels directly")
def test_kernels_run_under_the_triton_interpreter_on_cpu() -> None:
    """CI has no GPU: run this file's kernel comparisons once under TRITON_INTERPRET=1 (the interpreter executes the
    kernels' Triton code with numpy), so a logic error in the kernels fails on CPU too."""
    assert "6 passed" in run_under_interpreter(__file__, "-k", "match_the", timeout=300)
