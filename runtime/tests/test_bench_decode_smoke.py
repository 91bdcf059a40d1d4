"""benchmarks/bench_decode.py on CPU at the smoke size: the engine decodes with the synthetic prefill, every
variant is timed, and the JSON records what the GPU runs need (environment, config, workload, per-variant numbers).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import bench_decode as bench  # benchmarks/ is on the path (conftest.py)
import pytest


def test_decode_benchmark_smoke_run(tmp_path):
    out = tmp_path / "decode.json"
    res = bench.main(["--preset", "smoke", "--device", "cpu", "--out", str(out), "--batches", "2", "--steps", "2"])
    saved = json.loads(out.read_text())
    assert saved["results"] == json.loads(json.dumps(res["results"]))
    for key in ("date", "torch", "python", "hardware", "git_commit"):
        assert key in saved["environment"]
    assert saved["config"]["hidden_size"] == 128 and saved["workload"]["timed_steps"] == 2
    (run,) = saved["results"]
    assert (run["batch"], run["context"]) == (2, 150)
    assert [(v["zos"], v["cuda_graphs"]) for v in run["variants"]] == [(True, False), (False, False)]  # CPU: eager
    for v in run["variants"]:
        assert v["ms_per_step"] > 0 and v["output_tok_s"] > 0 and v["gpu_ms_per_step"] is None
        assert abs(v["output_tok_s"] - 2 * 1e3 / v["ms_per_step"]) < 1e-6 * v["output_tok_s"]
        assert set(v["host_ms_per_step"]) == {"schedule", "execute", "process", "wait"}
        assert v["host_busy_ms"] <= v["ms_per_step"] * 1.05
    assert set(run["zos_hidden_ms_per_step"]) == {"eager"}
    assert "profile_eager" not in run


def test_decode_profile_charges_every_stage_of_the_step(tmp_path):
    """--profile: eager steps under the profiler with bench_prefill's layer and stage ranges; on CPU the ops' self
    CPU time is charged (on CUDA the kernels' device time), and every stage's share adds up to the total. The tiny
    model has no Engram-free ratio-2 reuse layer, one of the real model's modes, so there is no 40-layer estimate."""
    res = bench.main(["--preset", "smoke", "--device", "cpu", "--out", str(tmp_path / "decode.json"), "--batches",
                      "2", "--steps", "1", "--profile"])
    profile = res["results"][0]["profile_eager"]
    stages = profile["stage_ms_per_step"]
    for stage in ("moe experts", "sparse attention", "projections", "hc"):
        assert stages.get(stage, 0.0) > 0, (stage, stages)
    assert abs(sum(stages.values()) - profile["kernel_ms_per_step"]) < 1e-6 * profile["kernel_ms_per_step"] + 1e-9
    assert profile["ranges_not_found"] == [] and profile["forty_layer_ms_per_step"] is None
    assert set(profile["layer_ms_per_step"]) > {"outside layers"}
    paths = profile["by_layer_and_path_ms_per_step"]
    assert abs(sum(paths.values()) - profile["kernel_ms_per_step"]) < 1e-6 * profile["kernel_ms_per_step"] + 1e-9
    assert list(paths.values()) == sorted(paths.values(), reverse=True)
    assert profile["top_kernels"] and profile["steps"] == 3


def test_a_run_below_the_requested_batch_is_refused():
    """tok/s counts the requested batch, so fewer running sequences or a preemption must stop the benchmark
    (session 15 run 7: batch 64 at 131k did not fit the KV budget and reported 7.20 ms/step)."""
    def engine(running: int, preemptions: int) -> SimpleNamespace:
        return SimpleNamespace(scheduler=SimpleNamespace(running=[object()] * running, num_preemptions=preemptions))

    bench.full_batch_steps(engine(3, 5), 3, 5, "a variant")  # the whole batch, no new preemption: passes
    with pytest.raises(SystemExit, match="ran 2 of 3 sequences with 0 preemptions"):
        bench.full_batch_steps(engine(2, 5), 3, 5, "a variant")
    with pytest.raises(SystemExit, match="ran 3 of 3 sequences with 1 preemptions"):
        bench.full_batch_steps(engine(3, 5), 3, 4, "a variant")


def test_synthetic_prefill_leaves_what_decode_needs():
    """After the synthetic prefill every slot's index-key publisher is the one decode steps expect, so decode runs
    the fixed-shape path the GPU captures."""
    import torch
    from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
    from mini_deepinfer.engine.sampling_params import SamplingParams
    from mini_deepinfer.models.deepseek_v41.cache import V41Cache
    from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
    from mini_deepinfer.models.deepseek_v41.config import tiny_config
    from mini_deepinfer.models.deepseek_v41.model import V41Model

    cfg = tiny_config()
    model = V41Model(cfg, build_random_weights(cfg, seed=0))
    bench.synthetic_prefill(model, torch.Generator().manual_seed(0))
    engine = LLMEngine(model, V41Cache, EngineConfig(max_model_len=300, max_num_seqs=2, kv_cache_memory_gb=0.1), "cpu")
    for n in (140, 141):
        engine.add_request(list(range(3, 3 + n)), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()
    slots = [s.state_slot for s in engine.scheduler.running]
    assert len(slots) == 2 and model.decode_ready(slots, engine.runner.cache)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv.all_free()
