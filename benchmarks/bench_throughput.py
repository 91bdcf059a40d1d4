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
- Floors (since session 82): per kind, the sum over its steps of step_floors.py's per-stage floors (each stage's
  FLOPs / matmul rate or its least bytes / copy rate, whichever is larger; weights, touched experts, cache rows and
  activations), each step taken as its sequences at their mean end position, at rates measured in the same run on
  CUDA: torch._scaled_mm's FP8 rate at --fp8-size^3 and the device copy the kernel benchmarks compare with
  (bench_deepgemm.copy_bandwidth_gbs); bf16: step_floors' constant. On CPU, or to use a card's figures, --rates.
  fraction_of_floor = floor / measured; stages step_floors does not estimate (top-k, window cache, norms, ...) are
  left out, so the floor is a lower bound.
- --dry-run (CPU, no weights): the same engine and scheduler on a stand-in model that returns zero logits and a
  cache that is sized like V41Cache but holds nothing. The steps are the engine's own (the greedy tokens do not
  change them: EOS is ignored), so their floors at --rates (e.g. a card's measured figures) are this workload's
  floors on that card; the times are not. One pass.
- Latency: per request, time to first token (TTFT) and total latency from the pass's start (all requests arrive
  then), and the time per output token after the first (TPOT: (finish - first token) / (outputs - 1)), the figures
  serving benchmarks quote.

Usage:
  python3 benchmarks/bench_throughput.py --preset medium --out $OUT/throughput_medium.json   # GPU
  OMP_NUM_THREADS=1 uv run benchmarks/bench_throughput.py --preset tiny --device cpu --rates 2,30 --requests 6 \\
      --input-min 4 --input-max 40 --output-min 2 --output-max 6 --out /tmp/throughput.json     # CPU smoke run
  uv run benchmarks/bench_throughput.py --preset medium --device cpu --dry-run --rates 1396,3024 --out /tmp/f.json
      # the medium workload's steps and their floors at an H100's FP8 and copy rates (CPU, ~20 s)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from bench_decode import PRESETS as DECODE_PRESETS
from bench_decode import add_model_args, random_model
from bench_deepgemm import copy_bandwidth_gbs
from bench_prefill import Clock, environment, fp8_matmul_rate, log, write_json
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.config import V41Config
from step_floors import BF16_TFLOPS, floors_ms, step_work

PRESETS = {
    "medium": {"config": DECODE_PRESETS["medium"]["config"], "requests": 256, "input_min": 100, "input_max": 1024,
               "output_min": 100, "output_max": 1024},
    "tiny": {"config": DECODE_PRESETS["tiny"]["config"], "requests": 64, "input_min": 16, "input_max": 256,
             "output_min": 16, "output_max": 128},
}


class ScheduleOnlyModel(torch.nn.Module):
    """--dry-run's model: the config, and one zero logit per sampled row (greedy then picks token 0; a row as wide as
    the vocabulary would make the sampler the run's cost)."""

    def __init__(self, config: V41Config):
        super().__init__()
        self.config = config

    def forward(self, batch, cache) -> torch.Tensor:
        return torch.zeros(len(batch.sample_rows), 1)


class PlannedCache:
    """--dry-run's cache: the block and slot plan of V41Cache (same bytes per block and slot), no tensors."""

    bytes_per_block = staticmethod(V41Cache.bytes_per_block)
    bytes_per_slot = staticmethod(V41Cache.bytes_per_slot)

    def __init__(self, config: V41Config, num_blocks: int, num_slots: int, device: torch.device):
        self.num_blocks, self.num_slots = num_blocks, num_slots


def draw_requests(args: argparse.Namespace, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request, from --seed."""
    gen = torch.Generator().manual_seed(args.seed)
    lens_in = torch.randint(args.input_min, args.input_max + 1, (args.requests,), generator=gen).tolist()
    lens_out = torch.randint(args.output_min, args.output_max + 1, (args.requests,), generator=gen).tolist()
    return [(torch.randint(3, vocab_size, (n,), generator=gen).tolist(), m) for n, m in zip(lens_in, lens_out)]


class StepLog:
    """Each step's scheduled kind, sequences, tokens and mean end position (context + query), and the span of its
    execute on the stream (CUDA events; host clock on CPU)."""

    def __init__(self, engine: LLMEngine, device: torch.device):
        self.engine, self.clock = engine, Clock(device)
        self.steps: list[tuple[bool, int, int, float]] = []

    def __enter__(self) -> StepLog:
        eng = self.engine
        self._schedule, self._execute = eng.scheduler.schedule, eng.runner.execute

        def schedule():
            step = self._schedule()
            if not step.is_empty:
                ends = [s.context_len + s.query_len for s in step.sequences]
                self.steps.append((step.is_prefill, len(ends), step.num_batched_tokens, sum(ends) / len(ends)))
            return step

        def execute(step, prev):
            self.clock.mark()
            handle = self._execute(step, prev)
            self.clock.mark()
            return handle

        eng.scheduler.schedule, eng.runner.execute = schedule, execute
        return self

    def __exit__(self, *exc) -> None:
        self.engine.scheduler.schedule, self.engine.runner.execute = self._schedule, self._execute

    def by_kind(self, cfg: V41Config, rates: dict, buckets: Sequence[int]) -> dict:
        """Per kind, and for decode per batch range (up to each of `buckets`, the CUDA-graph sizes): steps, sequences,
        tokens, ms (the execute spans), and the floor: the sum over the steps of step_floors' per-stage floors
        (FLOPs / rate or bytes / copy rate, whichever is larger, for the stages it estimates) at `rates` (measured in
        this run, or --dry-run's), each step taken as its sequences at their mean end position."""
        ms = self.clock.intervals_ms()[::2]  # execute spans; the odd intervals are the gaps between them
        floor_of: dict[tuple[int, int, int], float] = {}
        rows = []  # (is_prefill, sequences, tokens, ms, floor ms) per step
        for (is_prefill, n, t, end), m in zip(self.steps, ms):
            key = (t, round(end), n)
            if key not in floor_of:
                stages = floors_ms(step_work(cfg, *key), rates["fp8_tflops"], rates["bf16_tflops"], rates["copy_gbs"])
                floor_of[key] = sum(v["floor_ms"] for v in stages.values())
            rows.append((is_prefill, n, t, m, floor_of[key]))

        def summary(part: list) -> dict:
            total, floor = sum(r[3] for r in part), sum(r[4] for r in part)
            return {"steps": len(part), "sequences": sum(r[1] for r in part), "tokens": sum(r[2] for r in part),
                    "ms": total, "ms_per_step": total / len(part) if part else None, "floor_ms": floor,
                    "fraction_of_floor": floor / total if total else None}

        out = {kind: summary([r for r in rows if r[0] == (kind == "prefill")]) for kind in ("prefill", "decode")}
        edges = [0, *sorted({*buckets, max((r[1] for r in rows if not r[0]), default=1)})]
        out["decode"]["by_batch"] = {
            f"{lo + 1}-{hi}": summary([r for r in rows if not r[0] and lo < r[1] <= hi])
            for lo, hi in itertools.pairwise(edges) if any(not r[0] and lo < r[1] <= hi for r in rows)}
        return out


def run_pass(engine: LLMEngine, requests: list[tuple[list[int], int]], device: torch.device, rates: dict) -> dict:
    """All requests queued at once and run to completion; wall time, per-kind steps and floors, latencies, tokens."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    preemptions = engine.scheduler.num_preemptions
    with StepLog(engine, device) as steps:
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
    tpot = sorted((o.metrics.finish_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
                  for o in outs if len(o.token_ids) > 1)
    tokens = [o.token_ids for o in outs]
    return {"wall_s": wall, "input_tokens": n_in, "output_tokens": n_out, "output_tok_s": n_out / wall,
            "total_tok_s": (n_in + n_out) / wall, "engine_steps": len(steps.steps),
            "by_kind": steps.by_kind(engine.model_config, rates, engine.config.cuda_graph_batch_sizes),
            "preemptions": engine.scheduler.num_preemptions - preemptions,
            "ttft_s": {"p50": statistics.median(ttft), "p90": ttft[int(0.9 * (len(ttft) - 1))], "max": ttft[-1]},
            "latency_s": {"p50": statistics.median(latency), "max": latency[-1]},
            "tpot_ms": {"p50": 1e3 * statistics.median(tpot), "max": 1e3 * tpot[-1]} if tpot else None,
            "tokens_sha256": hashlib.sha256(repr(tokens).encode()).hexdigest()[:16], "_tokens": tokens}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after each pass)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    ap.add_argument("--device", default="cuda")
    for name in ("requests", "input_min", "input_max", "output_min", "output_max"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    ap.add_argument("--passes", type=int, default=3, help="passes over the same requests; the first is the warm-up")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-gb", type=float, default=8.0, help="the engine's KV budget")
    ap.add_argument("--fp8-size", type=int, default=8192, help="n of the n^3 _scaled_mm rate measurement (CUDA)")
    ap.add_argument("--rates", metavar="FP8_TFLOPS,COPY_GBS", type=lambda v: [float(x) for x in v.split(",")],
                    help="the floors' rates instead of measuring them (required on CPU, where nothing is measured)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU: the engine's steps without a model, and their floors at --rates (see above)")
    add_model_args(ap)
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if key != "config" and getattr(args, key) is None:
            setattr(args, key, value)
    if not (0 < args.input_min <= args.input_max and 0 < args.output_min <= args.output_max):
        ap.error("need 0 < input-min <= input-max and 0 < output-min <= output-max")
    if args.rates is not None and len(args.rates) != 2:
        ap.error("--rates takes FP8_TFLOPS,COPY_GBS")
    if args.device == "cpu" and args.rates is None:
        ap.error("on CPU give --rates (the floors' FP8 and copy rates are measured on CUDA only)")
    if args.dry_run:
        if args.device != "cpu":
            ap.error("--dry-run runs on --device cpu")
        args.passes = 1
    elif args.passes < 2:
        ap.error("need passes >= 2 (a warm-up and a timed pass)")
    if args.requests < 1:
        ap.error("need requests >= 1")
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
    if args.rates is not None:
        res["rates"] = {"fp8_tflops": args.rates[0], "copy_gbs": args.rates[1], "given": True}
    else:
        res["rates"] = {"fp8_tflops": fp8_matmul_rate(args.fp8_size, device, iters=10)["tflops"],
                        "fp8_n": args.fp8_size, "copy_gbs": copy_bandwidth_gbs()}
    res["rates"]["bf16_tflops"] = BF16_TFLOPS  # step_floors' bf16 rate: the highest measured here (H200)
    res["dry_run"] = args.dry_run
    log(f"FP8 matmul {res['rates']['fp8_tflops']:.0f} TFLOP/s, copy {res['rates']['copy_gbs']:.0f} GB/s")
    t0 = time.perf_counter()
    if args.dry_run:
        engine = LLMEngine(ScheduleOnlyModel(cfg), PlannedCache, engine_cfg, device)
    else:
        log(f"building random weights of {cfg.num_hidden_layers} layers on {device}")
        engine = LLMEngine(random_model(cfg, args, device), V41Cache, engine_cfg, device)
    res["setup_s"] = time.perf_counter() - t0
    res["engine"]["kv_blocks"], res["engine"]["state_slots"] = engine.cache_plan.num_blocks, engine.cache_plan.num_slots
    requests = draw_requests(args, cfg.vocab_size)
    first_tokens = None
    for i in range(args.passes):
        r = run_pass(engine, requests, device, res["rates"])
        tokens = r.pop("_tokens")
        first_tokens = first_tokens or tokens
        r["warmup"], r["tokens_equal_first_pass"] = i == 0, tokens == first_tokens
        res["passes"].append(r)
        write_json(args.out, res)
        p, d = r["by_kind"]["prefill"], r["by_kind"]["decode"]
        label = " (dry run: steps and floors only)" if args.dry_run else " (warm-up)" if i == 0 else ""
        log(f"pass {i}{label}: {r['wall_s']:.2f} s, {r['output_tok_s']:,.0f} output tok/s, "
            f"{r['total_tok_s']:,.0f} total tok/s; prefill {p['steps']} steps {p['ms']:.0f} ms (floor "
            f"{p['floor_ms']:.0f}), decode {d['steps']} steps {d['ms']:.0f} ms (mean {d['ms_per_step'] or 0:.2f}, floor "
            f"{d['floor_ms']:.0f}); {r['preemptions']} preemptions; "
            f"TTFT p50 {r['ttft_s']['p50']:.2f} s, TPOT p50 {(r['tpot_ms'] or {}).get('p50', 0):.2f} ms; tokens "
            f"{r['tokens_sha256']} "
            f"{'(= pass 0)' if r['tokens_equal_first_pass'] else '(DIFFER from pass 0)'}")
        log("  decode by batch (steps, ms per step, floor / measured): " + ", ".join(
            f"{b} {v['steps']} {v['ms_per_step']:.2f} {v['fraction_of_floor']:.2f}" for b, v in d["by_batch"].items()))
    if args.dry_run:  # the floors are the result; the pass's times are the stand-in model's
        (r,) = res["passes"]
        floor = sum(r["by_kind"][k]["floor_ms"] for k in ("prefill", "decode"))
        res["summary"] = {"floor_ms_per_pass": floor, "output_tok_s_at_floor": r["output_tokens"] / floor * 1e3}
    else:
        timed = res["passes"][1:]
        res["summary"] = {"output_tok_s_median": statistics.median(r["output_tok_s"] for r in timed),
                          "total_tok_s_median": statistics.median(r["total_tok_s"] for r in timed),
                          "all_passes_same_tokens": all(r["tokens_equal_first_pass"] for r in res["passes"])}
    write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()
