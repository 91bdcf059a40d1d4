"""The engine's dense FP8 linears on folded weights (ops.KernelWeights fold_dense_fp8, ops.linear;
docs/reports/deepgemm-v41-fold.md): the fold happens once at load with both scale forms, is not redone when a
KernelWeights is rebuilt from a folded one (engram_dense under EP x DP), a replaced weight drops its stale V3 form,
and `linear` matches the V4.1 reference on either side of DENSE_FOLD_MIN_TILES (CPU through mini-deepgemm's
references; GPU through the V4.1 kernel below it and the V3-recipe kernels from it).
"""

from __future__ import annotations

import pytest
import torch
from mini_deepgemm.reference import fp8_linear_ref
from mini_deepgemm.testing import calc_diff, random_bf16, random_fp8_weights

from mini_deepinfer.models.deepseek_v41 import ops


def fp8_linear_weights(N: int = 256, K: int = 512, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    _, q, s = random_fp8_weights(N=N, K=K, block=32, scale_fmt="ue8m0", generator=gen)
    return {"proj.weight": q, "proj.scale": s, "embed.weight": q[:40].clone(), "embed.scale": s[:40].clone()}


def test_fold_keeps_both_scale_forms_and_only_touches_dense_linears():
    w = fp8_linear_weights()
    kw = ops.KernelWeights(w)
    e = kw["proj.scale_128"].view(torch.int32) >> 23
    assert torch.equal(kw["proj.scale"].view(torch.uint8).long(), e.repeat_interleave(4, 0).repeat_interleave(4, 1))
    assert "embed.scale_128" not in kw and kw["embed.weight"] is w["embed.weight"], "a [rows, 32k] table is not a linear"
    again = ops.KernelWeights(dict(kw))
    assert again["proj.weight"] is kw["proj.weight"], "a folded weight must not be folded again"
    assert "proj.scale_128" not in ops.KernelWeights(w, fold_dense_fp8=False)
    kw["proj.weight"] = w["proj.weight"]
    assert "proj.scale_128" not in kw, "replacing the weight drops its V3 form"


@pytest.mark.parametrize("rows", [64, 128 * (ops.DENSE_FOLD_MIN_TILES // 8)])  # 8 column tiles: 8 and 64 tiles
def test_linear_on_folded_weights_matches_the_v41_reference_on_cpu(rows):
    w = fp8_linear_weights(N=1024, K=256, seed=rows)
    x = random_bf16(rows, 256, generator=torch.Generator().manual_seed(rows))
    got = ops.linear(x, ops.KernelWeights(w), "proj")
    assert calc_diff(got.float(), fp8_linear_ref(x, w["proj.weight"], w["proj.scale"]).float()) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_linear_on_folded_weights_matches_the_v41_reference_on_gpu():
    w = {k: v.cuda() for k, v in fp8_linear_weights(N=4608, K=5120, seed=3).items()}
    kw = ops.KernelWeights(w)
    x = random_bf16(4096, 5120, generator=torch.Generator().manual_seed(3)).cuda()
    want = fp8_linear_ref(x, w["proj.weight"], w["proj.scale"]).float()
    for rows in (1, 64, 65, 300, 4096):  # 36 column tiles: 36 to 1,152 tiles
        assert calc_diff(ops.linear(x[:rows], kw, "proj").float(), want[:rows]) < 1e-5, rows
