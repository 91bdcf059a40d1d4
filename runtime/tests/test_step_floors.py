"""benchmarks/step_floors.py: the stage map covers the checkpoint, the FLOP split keeps layer_flops' total, the expert
touch model's limits, and every floor it derives from the committed session-45 runs lies below the measured time
(a floor above a measurement would mean a wrong count or rate)."""

import json
import math

import pytest
import step_floors
from bench_prefill import layer_flops
from mini_deepinfer.models.deepseek_v41.checkpoint import expected_tensors
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config


@pytest.mark.parametrize("make_cfg", [V41Config, tiny_config], ids=["real", "tiny"])
def test_every_checkpoint_tensor_has_a_stage(make_cfg):
    cfg = make_cfg()
    layers, outside = step_floors.weight_bytes_by_layer(cfg)
    total = sum(b for stages in layers.values() for b in stages.values()) + sum(outside.values())
    assert total == sum(math.prod(shape) * dtype.itemsize for shape, dtype in expected_tensors(cfg).values())
    assert set(layers) == set(range(cfg.num_hidden_layers))


def test_weight_stage_names():
    assert step_floors.weight_stage("layers.3.attn.wq_b.weight") == "projections"
    assert step_floors.weight_stage("layers.2.attn.indexer.wq_b.scale") == "indexer"
    assert step_floors.weight_stage("layers.7.ffn.experts.11.w2.scale") == "moe experts (routed)"
    assert step_floors.weight_stage("layers.7.ffn.shared_experts.w1.weight") == "moe experts"
    assert step_floors.weight_stage("layers.1.engram.embed.weight") == "engram (table)"
    assert step_floors.weight_stage("head.weight") == "head"
    with pytest.raises(ValueError, match="layers.0.attn.unknown"):
        step_floors.weight_stage("layers.0.attn.unknown")


def test_routed_expert_bytes_are_fp4_values_and_ue8m0_scales():
    cfg = V41Config()
    layers, _ = step_floors.weight_bytes_by_layer(cfg)
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size * (1 / 2 + 1 / 32)  # e2m1 pairs + 1 byte per 32
    assert layers[5]["moe experts (routed)"] == cfg.n_routed_experts * per_expert


@pytest.mark.parametrize("tokens,cached", [(4096, 126976), (1, 131071), (37, 300)])
def test_stage_flops_keep_layer_flops_total(tokens, cached):
    cfg = V41Config()
    for role in cfg.layer_roles:
        split = step_floors.stage_flops(cfg, role, tokens, cached)
        assert sum(split.values()) == sum(layer_flops(cfg, role, tokens, cached).values())
        assert split["moe routing"] == 2 * tokens * cfg.hidden_size * cfg.n_routed_experts


def test_touched_fraction_limits():
    assert step_floors.touched_fraction(1, 6, 384) == pytest.approx(6 / 384)
    assert step_floors.touched_fraction(4096, 6, 384) > 1 - 1e-9
    assert step_floors.touched_fraction(64, 6, 384) == pytest.approx(0.635, abs=1e-3)


def test_decode_step_is_batch_times_one_token_forwards():
    cfg = V41Config()
    one = step_floors.step_work(cfg, 1, 4096, 1)
    eight = step_floors.step_work(cfg, 8, 4096, 8)
    for stage in ("projections", "sparse attention", "indexer", "hc"):
        assert eight[stage]["flops"] == 8 * one[stage]["flops"]


def test_floors_of_the_committed_runs_lie_below_the_measurements(tmp_path):
    out = tmp_path / "floors.json"
    cases = step_floors.main(["--out", str(out)])
    assert [c["case"] for c in cases] == ["prefill 4096 tokens at 131072", "decode batch 64 at 131072",
                                          "decode batch 256 at 32768"]
    for case in cases:
        for row in case["stages"]:
            if "floor_ms" in row:
                assert 0 < row["floor_ms"] <= row["measured_ms"], (case["case"], row)
        assert case["overlapped_floor_ms"] <= case["sum_of_stage_floors_ms"] <= case["estimated_measured_ms"]
    assert json.loads(out.read_text())["cases"][0]["stages"][0]["stage"] == "moe experts"


def test_prefill_sweep_tokens_per_second_grow_to_the_compute_bound():
    rows = step_floors.prefill_token_sweep(V41Config(), 131072, 1328.0, 813.0, 4282.0)
    rates = [r["tokens_per_s"] for r in rows]
    assert rates == sorted(rates)
    first, last = rows[0], rows[-1]
    assert first["moe_memory_ms"] > first["moe_compute_ms"] and last["moe_compute_ms"] > last["moe_memory_ms"]


def test_expert_parallel_rank_holds_a_share_of_the_touched_experts():
    cfg = V41Config()
    one, four = step_floors.step_work(cfg, 64, 131072, 64), step_floors.step_work(cfg, 64, 131072, 64, ep=4)
    assert step_floors.step_work(cfg, 64, 131072, 64, ep=1) == one
    for stage in one:  # the rank's own work is unchanged, the experts' FLOPs too (tokens x k pairs per rank)
        assert four[stage]["flops"] == one[stage]["flops"]
        if stage != "moe experts":
            assert four[stage]["bytes"] == one[stage]["bytes"]
    layers, _ = step_floors.weight_bytes_by_layer(cfg)
    routed = sum(layers[i]["moe experts (routed)"] for i in layers)
    k, E = cfg.num_experts_per_tok, cfg.n_routed_experts
    drop = routed * (step_floors.touched_fraction(64, k, E) - step_floors.touched_fraction(256, k, E) / 4)
    assert one["moe experts"]["bytes"] - four["moe experts"]["bytes"] == pytest.approx(drop)
