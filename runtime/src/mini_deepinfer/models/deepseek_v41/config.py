"""Typed configuration of DeepSeek-V4.1 and the per-layer roles derived from it.

`V41Config.from_hf_dict` reads a Hugging Face style `config.json` (with the nested `text_config`, as the real
checkpoint ships it). Every field keeps its HF name; the derived layer roles follow V41_MODEL.md section 1.3.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LayerMode(enum.Enum):
    """What a layer does on the compressed (ratio > 0) branch of its attention."""

    WINDOW = "window"  # ratio 0: only the sliding window
    FULL = "full"  # kv source: own compressor, own indexer with its own index keys
    REINDEX = "reindex"  # own indexer queries over the kv source's index keys (restricted to candidate blocks)
    REUSE = "reuse"  # reads the latest compressed KV and the latest top-k; no indexer


@dataclass(frozen=True)
class LayerRole:
    layer_id: int
    ratio: int
    mode: LayerMode
    kv_source: int | None  # layer whose compressed KV this layer attends to
    index_source: int | None  # layer whose top-k this layer uses (itself for FULL / REINDEX)
    is_candidate_source: bool
    uses_candidates: bool  # REINDEX layers after the candidate source restrict scores to its blocks
    has_engram: bool
    rope_theta: float
    use_yarn: bool


@dataclass(frozen=True)
class V41Config:
    vocab_size: int = 129280
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_lora_rank: int = 1024
    o_groups: int = 8
    moe_intermediate_size: int = 2304
    n_routed_experts: int = 384
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    rms_norm_eps: float = 1e-20
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 65536
    max_position_embeddings: int = 1048576
    sliding_window: int = 128
    compress_ratios: tuple[int, ...] = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
    kv_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20)
    index_source_layer_ids: tuple[int, ...] = (2, 8, 14, 20, 24, 28, 32, 36)
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    candidate_source_layer_id: int = 20
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_num_embeddings: tuple[int, ...] = (384006168, 384016682)
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 16000000
    engram_n_heads: int = 8
    engram_head_dim: int = 256
    engram_pad_token_id: int = 2
    engram_compressed_vocab_size: int = 99092
    num_nextn_predict_layers: int = 3
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    image_token_id: int = 129264
    gate_temp: float = 1.0
    weight_block_size: int = 32
    # 2.4 of the spec: the shipped reference lets ratio-2 kv sources score against the last publisher's index keys
    # at decode steps that close no group. True reproduces it; False binds each owner's own cache first.
    index_k_reference_quirk: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "V41Config":
        text = dict(d.get("text_config", d))
        top = {k: v for k, v in d.items() if k != "text_config"}
        merged = {**top, **text}
        scaling = merged.pop("rope_scaling", None) or {}
        if scaling:
            merged.setdefault("rope_factor", scaling.get("factor", 16.0))
            merged.setdefault("beta_fast", scaling.get("beta_fast", 32.0))
            merged.setdefault("beta_slow", scaling.get("beta_slow", 1.0))
            merged.setdefault(
                "original_max_position_embeddings", scaling.get("original_max_position_embeddings", 65536)
            )
        qc = merged.pop("quantization_config", None) or {}
        if "weight_block_size" in qc:
            bs = qc["weight_block_size"]
            if bs[0] != bs[1]:
                raise ValueError(f"weight_block_size must be square, got {bs}")
            merged["weight_block_size"] = bs[0]
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in merged.items():
            if k in known and k != "extra":
                kwargs[k] = tuple(v) if isinstance(v, list) else v
            else:
                extra[k] = v
        cfg = cls(**kwargs, extra=extra)
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, path: str | Path) -> "V41Config":
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        text: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "index_k_reference_quirk", "weight_block_size"):
                continue
            v = getattr(self, f.name)
            text[f.name] = list(v) if isinstance(v, tuple) else v
        for k in ("rope_factor", "beta_fast", "beta_slow", "original_max_position_embeddings"):
            text.pop(k)
        text["rope_scaling"] = {
            "type": "yarn",
            "factor": self.rope_factor,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }
        text["model_type"] = "deepseek_v41_text"
        return {
            "architectures": ["DeepseekV41ForCausalLM"],
            "model_type": "deepseek_v41",
            "dtype": "bfloat16",
            "tie_word_embeddings": False,
            "quantization_config": {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [self.weight_block_size, self.weight_block_size],
                "scale_fmt": "ue8m0",
                "expert_dtype": "fp4",
            },
            "text_config": text,
        }

    # ---------------------------------------------------------------- checks
    def validate(self) -> None:
        L = self.num_hidden_layers
        if len(self.compress_ratios) < L:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries, need >= {L}")
        for lid, r in enumerate(self.compress_ratios):
            # the model defines 0 (window only), 1 and 2; the checkpoint's compressor has wgate only for ratio 2
            # (V41_MODEL.md 2.3), so another ratio would fail later with a missing weight
            if r not in (0, 1, 2):
                raise ValueError(f"compress_ratios[{lid}] = {r}: V4.1 defines ratios 0 (window only), 1 and 2")
        if self.num_attention_heads * self.head_dim % self.o_groups:
            raise ValueError("num_attention_heads * head_dim must divide into o_groups")
        for s in self.kv_source_layer_ids:
            if not 0 <= s < L or self.compress_ratios[s] == 0:
                raise ValueError(f"kv source layer {s} must be a backbone layer with compress ratio > 0")
        for s in self.index_source_layer_ids:
            if self.compress_ratios[s] == 0:
                raise ValueError(f"index source layer {s} has compress ratio 0")
        for lid in range(L):
            if self.compress_ratios[lid] > 0:
                src = self._kv_source_of(lid)
                if src is None or self.compress_ratios[src] != self.compress_ratios[lid]:
                    raise ValueError(f"layer {lid}: no kv source with the same ratio at or before it")
        if self.engram_num_embeddings and len(self.engram_num_embeddings) != len(self.engram_layer_ids):
            raise ValueError("engram_num_embeddings must have one entry per engram layer")
        bs = self.weight_block_size
        for name, dim in [("hidden_size", self.hidden_size), ("q_lora_rank", self.q_lora_rank),
                          ("moe_intermediate_size", self.moe_intermediate_size), ("o_lora_rank", self.o_lora_rank)]:
            if dim % bs:
                raise ValueError(f"{name}={dim} must be a multiple of the weight block {bs}")

    def _kv_source_of(self, lid: int) -> int | None:
        cands = [s for s in self.kv_source_layer_ids if s <= lid]
        return max(cands) if cands else None

    # ---------------------------------------------------------------- derived
    @property
    def n_engram_orders(self) -> int:
        return self.engram_max_ngram_size - 1  # n-gram orders 2..max

    @property
    def engram_dim(self) -> int:
        return self.n_engram_orders * self.engram_n_heads * self.engram_head_dim

    @property
    def hc_mix_dim(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult  # pre, post, comb

    def layer_role(self, lid: int) -> LayerRole:
        ratio = self.compress_ratios[lid]
        if ratio == 0:
            mode, kv_src, idx_src = LayerMode.WINDOW, None, None
        else:
            kv_src = self._kv_source_of(lid)
            if lid in self.kv_source_layer_ids:
                mode = LayerMode.FULL
            elif lid in self.index_source_layer_ids:
                mode = LayerMode.REINDEX
            else:
                mode = LayerMode.REUSE
            idx_src = max(s for s in self.index_source_layer_ids if s <= lid and s >= kv_src)
        uses_cand = (
            mode == LayerMode.REINDEX
            and kv_src == self.candidate_source_layer_id
            and lid > self.candidate_source_layer_id
        )
        windowed_only = ratio == 0
        return LayerRole(
            layer_id=lid,
            ratio=ratio,
            mode=mode,
            kv_source=kv_src,
            index_source=idx_src,
            is_candidate_source=lid == self.candidate_source_layer_id,
            uses_candidates=uses_cand,
            has_engram=lid in self.engram_layer_ids,
            rope_theta=self.rope_theta if windowed_only else self.compress_rope_theta,
            use_yarn=not windowed_only,
        )

    @property
    def layer_roles(self) -> list[LayerRole]:
        return [self.layer_role(i) for i in range(self.num_hidden_layers)]

    def yarn_correction_range(self) -> tuple[int, int]:
        """The YaRN ramp [low, high] over rotary pair indices (V41: 15, 25)."""
        dim, base, orig = self.qk_rope_head_dim, self.compress_rope_theta, self.original_max_position_embeddings

        def corr(n_rot: float) -> float:
            return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(self.beta_fast)), 0)
        high = min(math.ceil(corr(self.beta_slow)), dim - 1)
        return low, high


def tiny_config() -> V41Config:
    """The tiny development config.

    Widths follow the published 68M tiny-random checkpoint (dim 128, 4 heads x 512, rope 64, q/o lora 128,
    2 output groups, 32 routed experts top-6, moe_inter 256, index head dim 128, 4 hc streams, Engram 4 heads x 64).
    The layer plan is extended to 8 layers so every layer mode runs on prompts of a few hundred tokens:

    | layer | ratio | mode | notes |
    | 0 | 0 | window-only | |
    | 1 | 0 | window-only | Engram |
    | 2 | 2 | FULL (kv + index source) | |
    | 3 | 2 | REUSE | Engram |
    | 4 | 1 | FULL, candidate source | |
    | 5 | 1 | REUSE | |
    | 6 | 1 | REINDEX (candidates of layer 4) | |
    | 7 | 1 | REUSE | |

    index_topk 16 and candidate_topk_blocks 4 (x 8 entries) make both selection levels binding past ~64 tokens.
    The Engram table sizes follow from the prime construction (engram.py) with engram_vocab_size 512.
    """
    from mini_deepinfer.models.deepseek_v41.engram import engram_table_sizes

    base = dict(
        hidden_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        head_dim=512,
        qk_rope_head_dim=64,
        q_lora_rank=128,
        o_lora_rank=128,
        o_groups=2,
        moe_intermediate_size=256,
        n_routed_experts=32,
        num_experts_per_tok=6,
        compress_ratios=(0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0),
        kv_source_layer_ids=(2, 4),
        index_source_layer_ids=(2, 4, 6),
        index_n_heads=4,
        index_head_dim=128,
        index_topk=16,
        candidate_source_layer_id=4,
        candidate_topk_blocks=4,
        candidate_block_size=8,
        engram_layer_ids=(1, 3),
        engram_vocab_size=512,
        engram_n_heads=4,
        engram_head_dim=64,
        engram_num_embeddings=(),
    )
    cfg = V41Config(**base)
    sizes = engram_table_sizes(cfg)
    cfg = dataclasses.replace(cfg, engram_num_embeddings=tuple(sizes))
    cfg.validate()
    return cfg
