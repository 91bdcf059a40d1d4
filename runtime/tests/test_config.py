"""V41Config: HF config.json round trip and the derived layer roles (V41_MODEL.md 1.1 and 1.3)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mini_deepinfer.models.deepseek_v41.config import LayerMode, V41Config, tiny_config


def _real_hf_config() -> dict:
    """The real HF config.json as V41_MODEL.md 1.1 lists it (nested text_config, vision_config, DSpark fields)."""
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "image_token_id": 129264,
        "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4", "fmt": "e4m3"},
        "vision_config": {"num_hidden_layers": 32, "hidden_size": 1024, "num_attention_heads": 16},
        "text_config": {
            "model_type": "deepseek_v41_text",
            "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
            "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "moe_intermediate_size": 2304,
            "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6,
            "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
            "routed_scaling_factor": 1.5, "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
            "max_position_embeddings": 1048576, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                             "original_max_position_embeddings": 65536},
            "compress_rope_theta": 160000, "sliding_window": 128,
            "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
            "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
            "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
            "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
            "engram_max_ngram_size": 4, "engram_vocab_size": 16000000, "engram_n_heads": 8,
            "engram_head_dim": 256, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
            "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
            "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
        },
    }


def test_real_hf_config_parses_to_the_defaults():
    cfg = V41Config.from_hf_dict(_real_hf_config())
    assert cfg == V41Config()  # the defaults are the real model
    assert cfg.weight_block_size == 32 and cfg.rope_factor == 16 and cfg.original_max_position_embeddings == 65536
    assert cfg.compress_ratios == (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
    # fields the config does not model are kept, not dropped
    assert cfg.extra["scoring_func"] == "sqrtsoftplus"
    assert cfg.extra["dspark_target_layer_ids"] == [37, 38, 39]
    assert cfg.extra["vision_config"]["num_hidden_layers"] == 32


@pytest.mark.parametrize("make", [V41Config, tiny_config], ids=["real", "tiny"])
def test_hf_dict_round_trip(make, tmp_path):
    cfg = make()
    d = cfg.to_hf_dict()
    assert d["model_type"] == "deepseek_v41" and d["architectures"] == ["DeepseekV41ForCausalLM"]
    text = d["text_config"]
    assert text["model_type"] == "deepseek_v41_text"
    assert text["rope_scaling"] == {"type": "yarn", "factor": cfg.rope_factor, "beta_fast": cfg.beta_fast,
                                    "beta_slow": cfg.beta_slow,
                                    "original_max_position_embeddings": cfg.original_max_position_embeddings}
    assert d["quantization_config"]["weight_block_size"] == [32, 32]
    assert V41Config.from_hf_dict(d) == cfg
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    assert V41Config.from_json(path) == cfg


def test_flat_config_without_text_config():
    flat = {k: v for k, v in V41Config().to_hf_dict()["text_config"].items()}
    assert V41Config.from_hf_dict(flat) == V41Config()


def test_invalid_configs_are_rejected():
    d = V41Config().to_hf_dict()
    d["quantization_config"]["weight_block_size"] = [32, 64]
    with pytest.raises(ValueError, match="square"):
        V41Config.from_hf_dict(d)
    with pytest.raises(ValueError, match="kv source layer 1"):
        dataclasses.replace(V41Config(), kv_source_layer_ids=(1, 2, 8, 14, 20)).validate()
    with pytest.raises(ValueError, match="one entry per engram layer"):
        dataclasses.replace(V41Config(), engram_num_embeddings=(5,)).validate()
    with pytest.raises(ValueError, match="hidden_size"):
        dataclasses.replace(V41Config(), hidden_size=5100).validate()
    with pytest.raises(ValueError, match="compress_ratios"):
        dataclasses.replace(V41Config(), compress_ratios=(0,) * 10).validate()
    with pytest.raises(ValueError, match=r"compress_ratios\[5\] = 4: V4.1 defines ratios 0"):
        ratios = (0, 0, 2, 2, 2, 4) + (2,) * 14 + (1,) * 20 + (0,) * 3
        dataclasses.replace(V41Config(), compress_ratios=ratios).validate()


def test_real_layer_roles():
    """V41_MODEL.md 1.3."""
    cfg = V41Config()
    roles = cfg.layer_roles
    assert len(roles) == 40
    modes = {m: [r.layer_id for r in roles if r.mode == m] for m in LayerMode}
    assert modes[LayerMode.WINDOW] == [0, 1]
    assert modes[LayerMode.FULL] == [2, 8, 14, 20]
    assert modes[LayerMode.REINDEX] == [24, 28, 32, 36]
    assert len(modes[LayerMode.REUSE]) == 40 - 2 - 4 - 4
    groups = {2: range(2, 8), 8: range(8, 14), 14: range(14, 20), 20: range(20, 40)}
    for src, layers in groups.items():
        for lid in layers:
            assert roles[lid].kv_source == src and roles[lid].ratio == (2 if src < 20 else 1)
    # REUSE layers take the latest top-k: the last index source at or before them within their kv group
    assert [roles[i].index_source for i in (3, 7, 9, 21, 23, 25, 27, 33, 39)] == [2, 2, 8, 20, 20, 24, 24, 32, 36]
    assert [r.layer_id for r in roles if r.is_candidate_source] == [20]
    assert [r.layer_id for r in roles if r.uses_candidates] == [24, 28, 32, 36]
    assert [r.layer_id for r in roles if r.has_engram] == [1, 14]
    for r in roles:
        windowed = r.layer_id < 2
        assert r.rope_theta == (10000.0 if windowed else 160000.0) and r.use_yarn == (not windowed)
        assert (r.kv_source is None) == (r.index_source is None) == windowed
    assert cfg.yarn_correction_range() == (15, 25)
    assert cfg.hc_mix_dim == 24 and cfg.engram_dim == 6144


def test_tiny_layer_roles_exercise_every_mode():
    cfg = tiny_config()
    got = [(r.ratio, r.mode, r.kv_source, r.index_source, r.is_candidate_source, r.uses_candidates, r.has_engram)
           for r in cfg.layer_roles]
    W, F, RI, RU = LayerMode.WINDOW, LayerMode.FULL, LayerMode.REINDEX, LayerMode.REUSE
    assert got == [
        (0, W, None, None, False, False, False),
        (0, W, None, None, False, False, True),
        (2, F, 2, 2, False, False, False),
        (2, RU, 2, 2, False, False, True),
        (1, F, 4, 4, True, False, False),
        (1, RU, 4, 4, False, False, False),
        (1, RI, 4, 6, False, True, False),
        (1, RU, 4, 6, False, False, False),
    ]
    # published tiny widths (V41_MODEL.md 1.4)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim) == (128, 4, 512, 64)
    assert (cfg.q_lora_rank, cfg.o_lora_rank, cfg.o_groups, cfg.moe_intermediate_size) == (128, 128, 2, 256)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok) == (32, 1, 6)
    assert (cfg.engram_n_heads, cfg.engram_head_dim, cfg.engram_num_embeddings) == (4, 64, (6748, 7592))
    # both selection levels bind on prompts of a few hundred tokens; candidates are wider than the top-k
    assert cfg.index_topk < cfg.candidate_topk_blocks * cfg.candidate_block_size < 200
