"""Offline throughput of the whole engine: many requests of random lengths through LLMEngine, prefill and decode
interleaved by the scheduler as a user's `LLM.generate` runs them.

Workload (the shape of nano-vllm's and vLLM's offline throughput benchmarks): --requests prompts with lengths drawn
uniformly from [--input-min, --input-max] and output lengths from [--output-min, --output-max] (seeded; ids random
in [3, vocab)), greedy, EOS ignored, all queued at once. Metric: output tokens/s and (prompt + output) tokens/s over
the wall time from the first add_request to the last finished request, GPU synchronised at both ends.

- Models: "medium" = V41Config() widths (dim 5120, 64 heads x 512, 384 routed experts top-6, ...) cut to bench_decode's
  four layers by default (--layers; window-only, ratio-2 FULL, ratio-1 FULL, ratio-1 REINDEX), random weights in the
  checkpoint formats built on the device; "tiny" = tiny_config() (CPU smoke run). Prefill is the real forward.
- Engine: EngineConfig defaults (chunked prefill, 4,096 tokens per step, ZOS on, CUDA graphs for decode steps of up
  to 256 rows) with --max-num-seqs and --kv-cache-gb; max_model_len = input-max + output-max.
- Passes: the same requests --passes times on one engine; the first is the warm-up (Triton compiles, CUDA graphs
  are captured on a bucket's first use), the others are timed and reported each. Every pass's generated tokens
  must equal the first's (greedy: recomputation is equivalent), which the JSON records.
- Per step: the scheduler's decision (prefill or decode, sequences, tokens) and the span the step's execute
  occupies on the stream (CUDA events around ModelRunner.execute; host clock on CPU), summed by kind: where a
  pass's time goes between prefill and decode steps.
- Latency: per request, time to first token and total latency from the pass's start (all requests arrive then).

Usage:
  python3 benchmarks/bench_throughput.py --preset medium --out $OUT/throughput_medium.json   # GPU
  OMP_NUM_THREADS=1 uv run benchmarks/bench_throughput.py --preset tiny --device cpu --requests 6 \\
      --input-min 4 --input-max 40 --output-min 2 --output-max 6 --out /tmp/throughput.json     # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from bench_decode import MEDIUM_LAYERS
from bench_prefill import (DENSE_ROUTES, MOE_ROUTES, SAMPLE_LAYERS, environment, log, select_moe_route,
                           trimmed_config, write_json)
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config
from mini_deepinfer.models.deepseek_v41.model import V41Model

PRESETS = {
    "medium": {"config": lambda layers: trimmed_config(V41Config(), layers, 100_000), "requests": 256,
               "input_min": 100, "input_max": 1024, "output_min": 100, "output_max": 1024},
    "tiny": {"config": lambda layers: tiny_config(), "requests": 64, "input_min": 16, "input_max": 256,
             "output_min": 16, "output_max": 128},
}


def draw_requests(args: argparse.Namespace, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request, from --seed."""
    gen = torch.Generator().manual_seed(args.seed)
    lens_in = torch.randint(args.input_min, args.input_max + 1, (args.requests,), generator=gen).tolist()
    lens_out = torch.randint(args.output_min, args.output_max + 1, (args.requests,), generator=gen).tolist()
    return [(torch.randint(3, vocab_size, (n,), generator=gen).tolist(), m) for n, m in zip(lens_in, lens_out)]


class StepLog:
    """Each step's scheduled kind, sequences and tokens, and its execute's span on the stream (or host clock)."""

    def __init__(self, engine: LLMEngine, cuda: bool):
        self.engine, self.cuda = engine, cuda
        self.steps: list[tuple[bool, int, int]] = []
        self.spans: list = []

    def __enter__(self) -> StepLog:
        eng = self.engine
        self._schedule, self._execute = eng.scheduler.schedule, eng.runner.execute

        def schedule():
            step = self._schedule()
            if not step.is_empty:
                self.steps.append((step.is_prefill, len(step.sequences), step.num_batched_tokens))
            return step

        def execute(step, prev):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                handle = self._execute(step, prev)
                end.record()
                self.spans.append((start, end))
            else:
                t0 = time.perf_counter()
                handle = self._execute(step, prev)
                self.spans.append(time.perf_counter() - t0)
            return handle

        eng.scheduler.schedule, eng.runner.execute = schedule, execute
        return self

    def __exit__(self, *exc) -> None:
        self.engine.scheduler.schedule, self.engine.runner.execute = self._schedule, self._execute

    def by_kind(self) -> dict:
        ms = [a.elapsed_time(b) for a, b in self.spans] if self.cuda else [1e3 * s for s in self.spans]
        out = {}
        for kind, is_prefill in (("prefill", True), ("decode", False)):
            rows = [(n, t, m) for (p, n, t), m in zip(self.steps, ms) if p == is_prefill]
            out[kind] = {"steps": len(rows), "sequences": sum(r[0] for r in rows), "tokens": sum(r[1] for r in rows),
                         "ms": sum(r[2] for r in rows),
                         "ms_per_step": sum(r[2] for r in rows) / len(rows) if rows else None}
        return out


def run_pass(engine: LLMEngine, requests: list[tuple[list[int], int]], device: torch.device) -> dict:
    """All requests queued at once and run to completion; wall time, per-kind steps, latencies, the tokens."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    preemptions = engine.scheduler.num_preemptions
    with StepLog(engine, device.type == "cuda") as steps:
        t0 = time.perf_counter()
        ids = [engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True))
               for prompt, n_out in requests]
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    outs = [outputs[i] for i in ids]
    bad = [o.request_id for o, (_, n) in zip(outs, requests) if o.finish_reason != "length" or len(o.token_ids) != n]
    if bad:
        raise SystemExit(f"bench_throughput: requests {bad[:5]} did not finish with their output length")
    n_in, n_out = sum(len(p) for p, _ in requests), sum(n for _, n in requests)
    ttft = sorted(o.metrics.first_token_time - t0 for o in outs)
    latency = sorted(o.metrics.finish_time - t0 for o in outs)
    tokens = [o.token_ids for o in outs]
    return {"wall_s": wall, "input_tokens": n_in, "output_tokens": n_out, "output_tok_s": n_out / wall,
            "total_tok_s": (n_in + n_out) / wall, "engine_steps": len(steps.steps), "by_kind": steps.by_kind(),
            "preemptions": engine.scheduler.num_preemptions - preemptions,
            "ttft_s": {"p50": statistics.median(ttft), "p90": ttft[int(0.9 * (len(ttft) - 1))], "max": ttft[-1]},
            "latency_s": {"p50": statistics.median(latency), "max": latency[-1]},
            "tokens_sha256": hashlib.sha256(repr(tokens).encode()).hexdigest()[:16], "_tokens": tokens}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after each pass)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=lambda s: tuple(s.split(",")), default=MEDIUM_LAYERS,
                    help=f"the medium preset's sample layers, comma-separated, of {','.join(SAMPLE_LAYERS)}")
    for name in ("requests", "input_min", "input_max", "output_min", "output_max"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    ap.add_argument("--passes", type=int, default=3, help="passes over the same requests; the first is the warm-up")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-gb", type=float, default=8.0, help="the engine's KV budget")
    ap.add_argument("--moe-route", choices=MOE_ROUTES, default="fp8")
    ap.add_argument("--dense-route", choices=DENSE_ROUTES, default="fold")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if key != "config" and getattr(args, key) is None:
            setattr(args, key, value)
    if not (0 < args.input_min <= args.input_max and 0 < args.output_min <= args.output_max):
        ap.error("need 0 < input-min <= input-max and 0 < output-min <= output-max")
    if args.requests < 1 or args.passes < 2:
        ap.error("need requests >= 1 and passes >= 2 (a warm-up and a timed pass)")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    cfg = PRESETS[args.preset]["config"](args.layers)
    engine_cfg = EngineConfig(max_model_len=args.input_max + args.output_max, max_num_seqs=args.max_num_seqs,
                              kv_cache_memory_gb=args.kv_cache_gb)
    res = {"benchmark": "throughput", "environment": environment(device),
           "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "extra"},
           "dtype": "weights in the checkpoint formats (FP8 e4m3 blocks, packed FP4 experts), bf16 activations, "
                    "cache FP8 window / FP4 compressed KV and index keys, fp32 logits",
           "engine": dataclasses.asdict(engine_cfg),
           "workload": {k: getattr(args, k) for k in ("preset", "requests", "input_min", "input_max", "output_min",
                                                       "output_max", "passes", "seed", "moe_route", "dense_route")}
           | {"layers": list(args.layers) if args.preset == "medium" else None,
              "sampling": "greedy, ignore_eos", "warmup_passes": 1},
           "passes": []}
    log(f"building random weights of {cfg.num_hidden_layers} layers on {device}")
    t0 = time.perf_counter()
    model = V41Model(cfg, build_random_weights(cfg, seed=args.seed, device=device), device,
                     fold_dense_fp8=args.dense_route == "fold")
    select_moe_route(model, args.moe_route)
    engine = LLMEngine(model, V41Cache, engine_cfg, device)
    res["setup_s"] = time.perf_counter() - t0
    res["engine"]["kv_blocks"], res["engine"]["state_slots"] = engine.cache_plan.num_blocks, engine.cache_plan.num_slots
    requests = draw_requests(args, cfg.vocab_size)
    first_tokens = None
    for i in range(args.passes):
        r = run_pass(engine, requests, device)
        tokens = r.pop("_tokens")
        first_tokens = first_tokens or tokens
        r["warmup"], r["tokens_equal_first_pass"] = i == 0, tokens == first_tokens
        res["passes"].append(r)
        write_json(args.out, res)
        p, d = r["by_kind"]["prefill"], r["by_kind"]["decode"]
        log(f"pass {i}{' (warm-up)' if i == 0 else ''}: {r['wall_s']:.2f} s, {r['output_tok_s']:,.0f} output tok/s, "
            f"{r['total_tok_s']:,.0f} total tok/s; prefill {p['steps']} steps {p['ms']:.0f} ms, decode "
            f"{d['steps']} steps {d['ms']:.0f} ms (mean {d['ms_per_step'] or 0:.2f}); {r['preemptions']} preemptions; "
            f"TTFT p50 {r['ttft_s']['p50']:.2f} s; tokens {r['tokens_sha256']} "
            f"{'(= pass 0)' if r['tokens_equal_first_pass'] else '(DIFFER from pass 0)'}")
    timed = res["passes"][1:]
    res["summary"] = {"output_tok_s_median": statistics.median(r["output_tok_s"] for r in timed),
                      "total_tok_s_median": statistics.median(r["total_tok_s"] for r in timed),
                      "all_passes_same_tokens": all(r["tokens_equal_first_pass"] for r in res["passes"])}
    write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()
