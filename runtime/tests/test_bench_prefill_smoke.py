"""benchmarks/bench_prefill.py (and its prefill_stages.py) on CPU: the layer plan, the synthetic cached context, the
profile attribution (with made-up CUDA events, since CI has no GPU) and an end-to-end run of the tiny preset.

Metrics: exact equality throughout (layer counts, cache rows, charged microseconds, logits of repeated steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import LayerMode, V41Config
from mini_deepinfer.models.deepseek_v41.engram import engram_table_sizes
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_flashmla.cache_layout import unpack_compressed_kv_fp4, unpack_index_k_fp4, unpack_window_fp8
from torch.autograd import DeviceType

import bench_prefill as bp  # benchmarks/ is on the path (conftest.py)
import prefill_stages as stages

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_prefill.py"


def test_real_model_layer_counts():
    counts, n_engram = bp.real_layer_counts()
    assert dict(counts) == {"window": 2, "r2-full": 3, "r2-reuse": 15, "r1-full": 1, "r1-reindex": 4, "r1-reuse": 15}
    assert n_engram == 2 and sum(counts.values()) == 40


def test_trimmed_config_keeps_real_widths_and_has_every_mode():
    real = V41Config()
    cfg = bp.trimmed_config(real, bp.SAMPLE_LAYERS, engram_vocab=1000)
    assert [bp.sample_name(r) for r in cfg.layer_roles] == list(bp.SAMPLE_LAYERS)
    for field in ("hidden_size", "num_attention_heads", "head_dim", "n_routed_experts", "moe_intermediate_size",
                  "index_topk", "candidate_topk_blocks", "vocab_size"):
        assert getattr(cfg, field) == getattr(real, field), field
    reindex = cfg.layer_roles[bp.SAMPLE_LAYERS.index("r1-reindex")]
    assert reindex.mode == LayerMode.REINDEX and reindex.uses_candidates
    assert cfg.layer_roles[bp.SAMPLE_LAYERS.index("r1-full")].is_candidate_source
    assert cfg.engram_num_embeddings == tuple(engram_table_sizes(cfg)) and cfg.engram_vocab_size == 1000


def test_trimmed_config_rejects_a_layer_without_its_source():
    with pytest.raises(ValueError, match="needs r1-full"):
        bp.trimmed_config(V41Config(), ["window", "r1-reuse"], None)
    with pytest.raises(ValueError, match="unknown"):
        bp.trimmed_config(V41Config(), ["r3-full"], None)
    cfg = bp.trimmed_config(V41Config(), ["r2-full", "r2-reuse"], None)
    assert [bp.sample_name(r) for r in cfg.layer_roles] == ["r2-full", "r2-reuse"]


def test_forty_layer_combination():
    counts = {"window": 2, "r1-reuse": 3}
    per_layer = {"window": 1.0, "window+engram": 1.5, "r1-reuse": 2.0}
    assert bp.weighted_equivalent(per_layer, 0.25, counts, n_engram=2) == 2 * 1.0 + 3 * 2.0 + 2 * 0.5 + 0.25
    del per_layer["window+engram"]  # a run without the Engram layer leaves its term out
    assert bp.weighted_equivalent(per_layer, 0.25, counts, n_engram=2) == 2 * 1.0 + 3 * 2.0 + 0.25
    assert bp.weighted_equivalent({"window": 1.0}, 0.25, counts, n_engram=2) is None


@pytest.fixture(scope="module")
def tiny_model():
    cfg = bp.trimmed_config(bp.PRESETS["tiny"]["base"](), bp.SAMPLE_LAYERS, None)
    return V41Model(cfg, build_random_weights(cfg, seed=0))


@pytest.mark.parametrize("cached", [100, 225])
def test_fill_cached_context_writes_exactly_the_state_of_the_cached_tokens(tiny_model, cached):
    """100 < window: a partial ring; 225: odd, so the ratio-2 source carries one token in its compressor tail."""
    cfg, W = tiny_model.config, tiny_model.config.sliding_window
    block_table = [3, 1, 2]
    cache = V41Cache(cfg, num_blocks=4, num_slots=2)
    bp.fill_cached_context(cache, tiny_model, cached, block_table, 1, torch.Generator().manual_seed(0))
    written = torch.zeros(2 * W, dtype=torch.bool)
    written[W + torch.arange(max(0, cached - W), cached) % W] = True
    for lid, ring in cache.window.items():
        assert bool(ring[written].any(1).all()) and not ring[~written].any(), lid
        assert torch.isfinite(unpack_window_fp8(ring[written])).all()
    assert sorted(cache.compressed_kv) == [2, 4]
    for lid in cache.compressed_kv:
        r = cfg.compress_ratios[lid]
        rows = V41Cache.entry_rows(block_table, torch.arange(cached // r), r)
        others = torch.ones(cache.compressed_kv[lid].shape[0], dtype=torch.bool)
        others[rows] = False
        for table, unpack in ((cache.compressed_kv[lid], unpack_compressed_kv_fp4),
                              (cache.index_k[lid], unpack_index_k_fp4)):
            assert bool(table[rows].any(1).all()) and not table[others].any(), lid
            assert torch.isfinite(unpack(table[rows])).all()
    tail = cached % 2
    kv, score = cache.comp_kv_state[2][1], cache.comp_score_state[2][1]
    assert bool(kv[:tail].any(1).all()) and torch.isfinite(score[:tail]).all()
    assert not kv[tail:].any() and torch.isneginf(score[tail:]).all()
    assert not cache.comp_kv_state[2][0].any()  # other slots untouched
    assert torch.isin(cache.engram_history[1], tiny_model.token_map).all()
    assert cache.index_k_publisher == [-1, 4]


def _event(name, device_type, start, end, id=0, self_us=0.0):
    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name=name, device_type=device_type, id=id, time_range=span, self_cpu_time_total=self_us)


def test_cuda_kernels_are_charged_to_the_ranges_open_at_their_launch():
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [
        _event("layer::window", cpu, 0, 100),
        _event("stage::moe", cpu, 10, 60),
        _event("stage::linear", cpu, 20, 30),
        _event("cudaLaunchKernel", cpu, 25, 26, id=7),
        _event("cuLaunchKernelEx", cpu, 50, 51, id=8),
        _event("cudaLaunchKernel", cpu, 150, 151, id=9),
        _event("aten::mm", cpu, 24, 27, id=8),  # an op id may equal a kernel's correlation id: ignored
        _event("gemm_kernel", gpu, 200, 205, id=7),
        _event("elementwise", gpu, 205, 208, id=8),
        _event("head_kernel", gpu, 300, 302, id=9),
        _event("lost_kernel", gpu, 400, 404, id=10),  # no launch recorded
        _event("stage::moe", gpu, 200, 208),  # a GPU-side annotation span, not a kernel
    ]
    charged, summary = stages.attribute_profile(events, cuda=True)
    assert charged == {("window", "moe/linear"): 5, ("window", "moe"): 3, (stages.OUTSIDE, "other"): 2,
                       (stages.OUTSIDE, "unlinked"): 4}
    assert summary["total_us"] == 14 and summary["unlinked_kernel_us"] == 4
    assert summary["top"][0] == {"name": "gemm_kernel", "us": 5, "calls": 1, "stage": "moe/linear"}
    weighted = stages.stage_summary(charged, {"window": 2}, n_engram=0)
    assert weighted["forty_layer_ms"]["moe dispatch/combine"] == pytest.approx(2 * 3e-3 + 2 * 5e-3)


def test_host_time_and_launches_are_charged_to_the_innermost_stage():
    """A stage's host time excludes its nested stages' (a child starting with its parent included); a layer's time
    outside every stage is "other"; launch calls count where they are made; time outside the layers is OUTSIDE."""
    cpu = DeviceType.CPU
    events = [
        _event("layer::window", cpu, 0, 100),
        _event("stage::moe", cpu, 10, 60),
        _event("stage::linear", cpu, 10, 30),  # starts with its parent
        _event("stage::linear", cpu, 40, 45),
        _event("cudaLaunchKernel", cpu, 12, 13),
        _event("cuLaunchKernelEx", cpu, 50, 51),
        _event("cudaLaunchKernel", cpu, 70, 71),
        _event("cudaMemcpyAsync", cpu, 72, 73),  # not a launch
        _event("stage::head", cpu, 100, 110),  # starts as the layer ends: outside it
        _event("cudaLaunchKernel", cpu, 105, 106),
    ]
    host = stages.host_by_stage(events)
    assert host == {("window", "moe/linear"): {"host_us": 25, "launches": 1},
                    ("window", "moe"): {"host_us": 25, "launches": 1},
                    ("window", "other"): {"host_us": 50, "launches": 1},
                    (stages.OUTSIDE, "head"): {"host_us": 10, "launches": 1}}
    summary = stages.host_summary(host)
    assert summary["launches"]["moe dispatch/combine"] == 2 and summary["host_ms"]["other"] == pytest.approx(0.05)


def test_tiny_preset_end_to_end(tmp_path):
    """The CLI as CI runs it: every sample layer timed, the 40-layer combination, a profile, the host's Python
    profile, the FP8 rate, and the snapshot restore (the two timed steps give bit-identical logits)."""
    out = tmp_path / "prefill.json"
    # one OpenMP thread: on a shared 2-core runner, torch's spinning worker threads slow these tiny ops ~30x
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--preset", "tiny", "--out", str(out),
                           "--py-profile", "5"], check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "40-layer equivalent:" in proc.stdout
    res = json.loads(out.read_text())
    layers = {lay["name"]: lay for lay in res["layers"]}
    assert list(layers) == list(bp.SAMPLE_LAYERS)
    assert all(lay["ms_mean"] > 0 and lay["tflop"] > 0 for lay in layers.values())
    eq = res["forty_layer_equivalent"]
    assert eq["engram_included"]
    counts = eq["counts"]
    want = (sum(n * layers[k]["ms_mean"] for k, n in counts.items())
            + 2 * (layers["window+engram"]["ms_mean"] - layers["window"]["ms_mean"]) + res["outside_layers_ms"])
    assert eq["ms_per_step"] == pytest.approx(want)
    assert eq["tokens_per_s_per_gpu"] == pytest.approx(res["workload"]["tokens"] / want * 1e3)
    assert res["workload"]["cached"] == res["workload"]["context"] - res["workload"]["tokens"]
    assert res["checks"]["max_abs_logit_diff_first_vs_last_step"] == 0.0
    assert res["fp8_matmul"]["tflops"] > 0
    py = res["py_profile"]
    assert len(py["by_own_time"]) == len(py["by_cumulative_time"]) == 5
    assert "run_step" in py["by_cumulative_time"][0]["function"]  # the profiled call itself is the outermost
    profile = res["stages"]
    assert profile["ranges_not_found"] == []
    headline = set(profile["summary"]["profiled_step_ms"])
    assert {"moe experts", "sparse attention", "projections", "indexer", "top-k", "engram"} <= headline
    assert sum(profile["summary"]["profiled_step_ms"].values()) == pytest.approx(
        sum(profile["by_layer_and_path_ms"].values()))


def test_many_sequences_per_step(tmp_path):
    """--seqs: the step's tokens split over fresh sequences (context = tokens / seqs), each in its own slot and
    blocks; FLOPs counted per sequence."""
    out = tmp_path / "seqs.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--preset", "tiny", "--out", str(out),
                           "--seqs", "4", "--tokens", "32", "--context", "8", "--warmup", "0", "--steps", "2",
                           "--no-profile"], check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert (res["workload"]["sequences"], res["workload"]["cached"]) == (4, 0)
    assert res["checks"]["max_abs_logit_diff_first_vs_last_step"] == 0.0
    cfg = bp.trimmed_config(bp.PRESETS["tiny"]["base"](), bp.SAMPLE_LAYERS, None)
    window = next(lay for lay in res["layers"] if lay["name"] == "window")
    assert window["flops"] == {k: 4 * v for k, v in bp.layer_flops(cfg, cfg.layer_roles[0], 8, 0).items()}
    with pytest.raises(SystemExit):  # 5 does not divide the preset's 32 tokens
        bp.parse_args(["--out", str(out), "--preset", "tiny", "--seqs", "5"])


def test_mixed_step(tmp_path):
    """--mix: one long sequence beside fresh short prompts, each with its own context, slot and blocks; FLOPs counted
    per sequence; a malformed group is refused with its text named."""
    out = tmp_path / "mix.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--preset", "tiny", "--out", str(out),
                           "--mix", "1x16@300,3x4@4", "--layers", "window,r2-full", "--warmup", "0", "--steps", "2",
                           "--no-profile"], check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    w = res["workload"]
    assert (w["sequences"], w["tokens"], w["context"], w["cached"], w["mix"]) == (4, 28, 300, 284, "1x16@300,3x4@4")
    assert res["checks"]["max_abs_logit_diff_first_vs_last_step"] == 0.0
    cfg = bp.trimmed_config(bp.PRESETS["tiny"]["base"](), ["window", "r2-full"], None)
    full = next(lay for lay in res["layers"] if lay["name"] == "r2-full")
    one = [bp.layer_flops(cfg, cfg.layer_roles[1], 16, 284), bp.layer_flops(cfg, cfg.layer_roles[1], 4, 0)]
    assert full["flops"] == {k: one[0][k] + 3 * one[1][k] for k in one[0]}
    for bad in ("2x8", "1x0@8", "1x9@8"):
        with pytest.raises(SystemExit):
            bp.parse_args(["--out", str(out), "--preset", "tiny", "--mix", bad])
    fresh = bp.parse_args(["--out", str(out), "--preset", "tiny", "--mix", "3x64@64"])  # more tokens than any context
    assert (fresh.tokens, fresh.context, bp.cached_tokens(fresh)) == (192, 64, [0, 0, 0])

def test_sweep_and_ep_two_ranks_on_cpu(tmp_path):
    """--sweep alone (no main run) and EP2 x DP2 under torchrun on gloo: the per-count rows, one JSON per rank,
    each rank's own sequence (different logits) through the same layers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "sweep.json"
    args = ["--device", "cpu", "--preset", "tiny", "--no-profile", "--steps", "1"]
    proc = subprocess.run([sys.executable, str(BENCH), *args, "--out", str(out), "--no-main", "--sweep", "16,40"],
                          check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["sweep"]
    assert [r["tokens"] for r in rows] == [16, 40] and all(r["ms_per_step"] > 0 for r in rows)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    proc = subprocess.run([*torchrun, str(BENCH), *args, "--out", str(tmp_path / "ep.json")],
                          check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"ep.rank{r}.json").read_text()) for r in range(2)]
    assert all(r["workload"]["ep_size"] == 2 and r["forty_layer_equivalent"]["ms_per_step"] > 0 for r in ranks)
    assert [r["workload"]["rank"] for r in ranks] == [0, 1]


def test_sweep_records_out_of_memory_where_the_context_is_built(tmp_path, monkeypatch):
    """A count whose context does not fit is a recorded row, and the sweep goes on to the next count."""
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(bp, "build_context", out_of_memory)
    res = {"fp8_matmul": {}}
    bp.sweep_tokens(SimpleNamespace(sweep=[16, 40], out=tmp_path / "sweep.json"), None, torch.device("cpu"), res)
    assert [r["tokens"] for r in res["sweep"]] == [16, 40]
    assert all(r["error"].startswith("out of memory: CUDA out of memory") for r in res["sweep"])
