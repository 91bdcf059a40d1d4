"""benchmarks/bench_throughput.py on CPU at a smoke size: requests of random lengths run end to end through the
engine, each pass reports its wall time, its steps by kind and their floors, and the tokens, and a timed pass equals
the warm-up's; the dry run (no model) schedules the same steps."""

from __future__ import annotations

import json

import bench_throughput as bench  # benchmarks/ is on the path (conftest.py)
import pytest


def test_throughput_benchmark_smoke_run(tmp_path):
    out = tmp_path / "throughput.json"
    args = ["--preset", "tiny", "--device", "cpu", "--out", str(out), "--requests", "5", "--input-min", "3",
            "--input-max", "30", "--output-min", "1", "--output-max", "4", "--passes", "2", "--max-num-seqs", "4", "--kv-cache-gb", "0.25",
            "--rates", "2,30"]
    res = bench.main(args)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(res))
    for key in ("date", "torch", "python", "hardware", "git_commit"):
        assert key in saved["environment"]
    requests = bench.draw_requests(bench.parse_args(args), saved["config"]["vocab_size"])
    n_in, n_out = sum(len(p) for p, _ in requests), sum(n for _, n in requests)
    assert len(saved["passes"]) == 2 and saved["passes"][0]["warmup"] and not saved["passes"][1]["warmup"]
    for p in saved["passes"]:
        assert (p["input_tokens"], p["output_tokens"]) == (n_in, n_out)
        assert p["tokens_equal_first_pass"]
        prefill, decode = p["by_kind"]["prefill"], p["by_kind"]["decode"]
        assert prefill["tokens"] == n_in  # every prompt token computed once (no preemption at this size)
        assert prefill["steps"] + decode["steps"] == p["engine_steps"]
        assert decode["tokens"] == decode["sequences"]  # one query token per sequence and decode step
        assert 0 < p["ttft_s"]["p50"] <= p["latency_s"]["max"] <= p["wall_s"]
        assert 0 < p["tpot_ms"]["p50"] <= p["tpot_ms"]["max"] <= 1e3 * p["wall_s"]
        for kind in (prefill, decode):  # a floor below the measured time, at the run's rates
            assert 0 < kind["floor_ms"] and 0 < kind["fraction_of_floor"] < 1
        by_batch = decode["by_batch"].values()  # the decode steps by batch range, each once
        assert sum(b["steps"] for b in by_batch) == decode["steps"]
        assert sum(b["ms"] for b in by_batch) == pytest.approx(decode["ms"])
    assert saved["rates"]["fp8_tflops"] > 0 and saved["rates"]["copy_gbs"] > 0
    # --dry-run: the engine's steps without the model, the same as the real run's, and their floors at given rates
    dry = bench.main([*args, "--dry-run", "--out", str(tmp_path / "dry.json")])
    (dry_pass,) = dry["passes"]
    for kind in ("prefill", "decode"):
        real_kind, dry_kind = saved["passes"][1]["by_kind"][kind], dry_pass["by_kind"][kind]
        assert [real_kind[k] for k in ("steps", "sequences", "tokens")] == [dry_kind[k] for k in
                                                                          ("steps", "sequences", "tokens")]
    assert dry["summary"]["floor_ms_per_pass"] > 0 and dry["rates"]["given"]
    assert saved["summary"]["all_passes_same_tokens"]
    assert saved["summary"]["output_tok_s_median"] == saved["passes"][1]["output_tok_s"]


@pytest.mark.parametrize("bad", [["--input-min", "0"], ["--output-min", "9", "--output-max", "8"], ["--passes", "1"],
                                 ["--rates", "1,2,3", "--device", "cpu"], ["--dry-run", "--rates", "1,2"],
                                 ["--device", "cpu"]])
def test_bad_workloads_are_refused(tmp_path, bad):
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "tiny", "--out", str(tmp_path / "t.json"), *bad])
