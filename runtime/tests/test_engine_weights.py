"""The engine model's weight dict holds only what a forward reads: every storage it keeps is read by a prefill or a
decode step (tiny model, CPU), apart from the named exceptions. Session 47 found the stored FP8 wo_a and its scale
kept beside their bf16 dequantization (ops.prepare_weights), 1.34 GB per rank at the real model's widths."""

import pytest
import torch
from mini_deepgemm.reference import weight_dequant_fp8

from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import tiny_config
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.worker.forward_batch import ForwardBatch

# held but not read by a text forward: the image tokens' gate bias (vision is not covered) and the expert ids that
# moe.stack_experts records beside each stack
NOT_READ = (".ffn.gate.bias_vl", ".ffn.experts.ids")
# KernelWeights' V3-recipe scales of the folded dense FP8 weights (fp32 [N / 128, K / 128], 1/4096 of the weight's
# bytes): read by calls of at least ops.DENSE_FOLD_MIN_TILES output tiles, more rows than this test's forwards have
NOT_READ_BY_SMALL_CALLS = (".scale_128",)


class ReadLog:
    """Mixed into the model's weights dict class: records the names read through it in `read`."""

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name: str, default=None):
        self.read.add(name)
        return super().get(name, default)


def record_reads(weights: dict) -> dict:
    """`weights` itself, its class swapped for one that also records reads (KernelWeights keeps its behaviour)."""
    if type(weights) is dict:
        weights = type("DictReadLog", (ReadLog, dict), {})(weights)
    else:
        weights.__class__ = type(f"{type(weights).__name__}ReadLog", (ReadLog, type(weights)), {})
    weights.read = set()
    return weights


def test_prepare_weights_replaces_fp8_wo_a_by_its_bf16_dequantization():
    w = build_random_weights(tiny_config(), seed=3)
    out = ops.prepare_weights(w)
    names = [n for n in w if n.endswith(".wo_a.weight")]
    assert names
    for name in names:
        base = name.removesuffix(".weight")
        assert name not in out and f"{base}.scale" not in out
        expected = weight_dequant_fp8(w[name], w[f"{base}.scale"]).to(torch.bfloat16)
        assert torch.equal(out[f"{base}.weight_bf16"], expected)
    assert ops.prepare_weights(out).keys() == out.keys()  # prepared weights passed in again stay as they are


@pytest.mark.parametrize("use_kernels", [False, True], ids=["plain", "kernel_weights"])
def test_every_engine_weight_storage_is_read_by_a_forward(use_kernels):
    """use_kernels=True on CPU: ops.KernelWeights' folded dense FP8 forms and stacked shared experts, with
    mini-deepgemm's references in place of its kernels."""
    cfg = tiny_config()
    model = V41Model(cfg, build_random_weights(cfg, seed=3), use_kernels=use_kernels)
    model.w = weights = record_reads(model.w)
    cache = V41Cache(cfg, num_blocks=8, num_slots=2)
    n = 150  # past the window (128) and several compressed entries of every ratio
    prompt = torch.randint(3, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    model(ForwardBatch(prompt, [n], [0], [[1, 2]], [1], [n - 1]), cache)
    model(ForwardBatch(prompt[:1], [1], [n], [[1, 2]], [1], [0]), cache)  # one decode step
    read = {weights[name].untyped_storage().data_ptr() for name in weights.read if name in weights}
    exempt = NOT_READ + (NOT_READ_BY_SMALL_CALLS if use_kernels else ())
    unread = [name for name, t in dict.items(weights) if t.untyped_storage().data_ptr() not in read
              and not name.endswith(exempt)]
    assert not unread, f"held but never read by a forward: {unread[:8]} ({len(unread)} in all)"
