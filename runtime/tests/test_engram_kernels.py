"""The Engram injection on the engine's path (ops.engram_inject with KernelWeights: the table rows straight into wkv,
then the fused gate; on CUDA both as the kernels of layers/engram_kernels.py) against the reference's (a plain
weights dict).

Metrics. The operand kernel against ops.engram_operand: bit for bit, both forms. The fused gate against
ops.engram_gate: outputs within one bf16 rounding (kernel_devices.assert_within_one_rounding: |fused - ref| <=
2^-7 |ref| + 1e-6, and >= 95% equal on CUDA; the three fp32 sums run in another order, a few ulp in the gate). The
table rows as wkv's activations: dequantized to bf16 and quantized again (the reference's route) they give the same
values, bit for bit, and in the V3 form the same operand wherever each 32-group's largest code is above 224. The
whole injection, engine against reference: relative L2 error of the added value below 2e-3 (the folded GEMM and the
sum orders; on CPU, where both GEMMs are the same reference, measured 0).
Inputs are random (streams of differing scales, keys and values of another), never zeros.
"""

from __future__ import annotations

import pytest
import torch
from mini_deepgemm import per_token_group_quant_fp8
from mini_deepgemm.reference import act_dequant, act_quant, fold_ue8m0_to_128, weight_quant_fp8

from mini_deepinfer.layers import engram_kernels as egk
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import tiny_config

from kernel_devices import (DEVICE, INTERPRET, assert_within_one_rounding, interpreter_child, kernel_test,
                            run_under_interpreter)

EPS = 1e-20  # V41Config.rms_norm_eps
needs_triton = pytest.mark.skipif(egk.triton is None, reason="needs triton")

# (tokens, D): V4.1's widths at decode and prefill sizes, and ragged D (not a multiple of the kernel's 512 columns)
SHAPES = [(1, 5120), (17, 5120), (4096, 5120), (5, 1001), (64, 200)] if DEVICE == "cuda" else [(3, 128), (2, 200)]


def _gate_inputs(T: int, D: int, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    stream_scale = torch.tensor([1.0, 0.5, 2.0, 0.25])[None, :, None]
    H = (torch.randn(T, 4, D, generator=g) * stream_scale).to(torch.bfloat16)
    kv = (torch.randn(T, 5 * D, generator=g) * 0.7).to(torch.bfloat16)
    qw = (torch.rand(4, D, generator=g) + 0.5).to(torch.bfloat16)
    kw = (torch.rand(4, D, generator=g) + 0.5).to(torch.bfloat16)
    return tuple(t.to(device) for t in (H, kv, qw, kw))


@needs_triton
@kernel_test
@pytest.mark.parametrize("T,D", SHAPES)
def test_fused_gate_matches_the_reference(T: int, D: int) -> None:
    H, kv, qw, kw = _gate_inputs(T, D, DEVICE, seed=T + D)
    assert_within_one_rounding(egk.engram_gate_fused(H, kv, qw, kw, EPS), ops.engram_gate(H, kv, qw, kw, EPS))


@needs_triton
@kernel_test
def test_fused_gate_strides_batch_invariance_and_bad_shapes() -> None:
    D = 128 if INTERPRET else 5120
    H, kv, qw, kw = _gate_inputs(6, D, DEVICE, seed=3)
    wide = torch.cat([kv, kv[:, :7]], 1)[:, : 5 * D]  # row stride 5 D + 7: a view, not a copy
    got = egk.engram_gate_fused(H, wide, qw, kw, EPS)
    assert torch.equal(got, egk.engram_gate_fused(H, kv, qw, kw, EPS))
    for i in (0, 5):  # a token alone: bit-identical to the same token in the batch
        assert torch.equal(egk.engram_gate_fused(H[i:i + 1], kv[i:i + 1], qw, kw, EPS), got[i:i + 1])
    assert egk.engram_gate_fused(H[:0], kv[:0], qw, kw, EPS).shape == (0, 4, D)
    with pytest.raises(ValueError, match="needs kv"):
        egk.engram_gate_fused(H, kv[:, :-1], qw, kw, EPS)


# (tokens, rows per token, row width): the model's 24 rows of 256, a count that leaves a program's rows partly unused,
# 128-wide rows (one fold block each)
OPERAND_SHAPES = [(4096, 24, 256), (3, 24, 256), (5, 5, 128), (1, 11, 256)] if DEVICE == "cuda" else \
    [(3, 24, 256), (2, 5, 128)]


@needs_triton
@kernel_test
@pytest.mark.parametrize("fold", [False, True], ids=["per32", "fold128"])
@pytest.mark.parametrize("T,n,width", OPERAND_SHAPES)
def test_operand_kernel_is_bit_exact(T: int, n: int, width: int, fold: bool) -> None:
    g = torch.Generator().manual_seed(T * n + width)
    rows = torch.randn(300, width, generator=g) * torch.rand(300, 1, generator=g).pow(4) * 16  # scales spread
    table, scale = act_quant(rows)
    row_ids = torch.randint(0, 300, (T, n), generator=g)
    want = ops.engram_operand(table, scale, row_ids, fold)
    got = egk.engram_operand(table.to(DEVICE), scale.to(DEVICE), row_ids.to(DEVICE), fold)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.cpu().view(torch.uint8) if a.element_size() == 1 else a.cpu(),
                           b.view(torch.uint8) if b.element_size() == 1 else b)


@interpreter_child
def test_kernels_run_under_the_triton_interpreter_on_cpu() -> None:
    """CI has no GPU: run this file's kernel tests once under TRITON_INTERPRET=1."""
    assert "7 passed" in run_under_interpreter(__file__, "-k", "fused_gate or operand_kernel", timeout=300)


def test_table_rows_are_the_activations_the_reference_quantizes() -> None:
    """The reference dequantizes the gathered rows to bf16 and wkv quantizes them again (UE8M0 per 32, or folded per
    128): the same values come back, so the engine feeds wkv the stored rows."""
    g = torch.Generator().manual_seed(0)
    rows, scale = act_quant(torch.randn(40, 768, generator=g) * torch.rand(40, 1, generator=g) * 8)
    values = act_dequant(rows, scale).to(torch.bfloat16)  # exact: e4m3 x 2^e has 4 significant bits
    q, s = per_token_group_quant_fp8(values, 32, "ue8m0")
    assert torch.equal(act_dequant(q, s), act_dequant(rows, scale))
    top = rows.float().abs().view(40, -1, 32).amax(-1)
    assert bool((top >= 224).all())
    keeps = top > 224  # a group whose largest code is 224 quantizes again one binade lower: same values
    assert torch.equal(s.view(torch.uint8)[keeps], scale.view(torch.uint8)[keeps]) and bool(keeps.any())
    if bool(keeps.all(-1).any()):  # rows where every group keeps its scale: the folded operand too, bit for bit
        whole = keeps.view(40, -1, 4).all(-1).all(-1)
        fq, fs = per_token_group_quant_fp8(values, 32, "ue8m0", fold_128=True)
        tq, ts = fold_ue8m0_to_128(rows, scale, 1)
        assert torch.equal(fq[whole].view(torch.uint8), tq[whole].view(torch.uint8)) and torch.equal(fs[whole],
                                                                                                     ts[whole])


def _engram_weights(D: int, width: int, n_rows: int, seed: int) -> dict[str, torch.Tensor]:
    """One Engram layer's tensors ("e.*"): a table of n_rows rows of `width` (e4m3, UE8M0 per 32, quantized from
    random rows), wkv FP8 [5 D, n * width] (UE8M0 per 32 x 32), q / k weights bf16 [4, D]."""
    g = torch.Generator().manual_seed(seed)
    table, table_scale = act_quant(torch.randn(n_rows, width, generator=g))
    wkv, wkv_scale = weight_quant_fp8(torch.randn(5 * D, 12 * width, generator=g) * (12 * width) ** -0.5)
    return {"e.embed.weight": table, "e.embed.scale": table_scale, "e.wkv.weight": wkv, "e.wkv.scale": wkv_scale,
            "e.q_weight": (torch.rand(4, D, generator=g) + 0.5).to(torch.bfloat16),
            "e.k_weight": (torch.rand(4, D, generator=g) + 0.5).to(torch.bfloat16)}


@pytest.mark.parametrize("T", [0, 5, 1700])  # none; few rows (V4.1 kernels); >= 64 tiles of wkv (the V3 form)
def test_engine_injection_matches_the_reference(T: int) -> None:
    cfg = tiny_config()
    D, width = 128, 64
    w = _engram_weights(D, width, 500, seed=T)
    g = torch.Generator().manual_seed(T + 1)
    H = (torch.randn(T, 4, D, generator=g) * 2).to(torch.bfloat16)
    row_ids = torch.randint(0, 500, (T, 12), generator=g)
    kernel_weights = ops.KernelWeights(w)
    assert ops.dense_v3_form(T, kernel_weights, "e.wkv") == (T == 1700)
    want = ops.engram_inject(H, row_ids, w, "e", cfg)
    got = ops.engram_inject(H, row_ids, kernel_weights, "e", cfg)
    assert got.shape == want.shape == (T, 4, D) and got.dtype == torch.bfloat16
    if T:  # compared as what was added to H, where an error in the gate or the value shows
        added, want_added = got.float() - H.float(), want.float() - H.float()
        err = ((added - want_added).norm() / want_added.norm()).item()
        print(f"relative L2 error of the added value, engine against reference: {err:.2e}")
        assert err < 2e-3
