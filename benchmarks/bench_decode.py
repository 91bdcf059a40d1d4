"""Decode benchmark of the engine (issue 7): output tokens/s and ms per decode step, with zero-overhead scheduling
(ZOS) on and off and CUDA graphs on and off, and where a step's time goes on the host.

Workload: `batch` sequences, each with `context` tokens already in the cache, decoding one token per step (greedy,
EOS ignored). Metric: output tokens/s = batch x steps / wall time of `steps` LLMEngine.step() calls after warm-up
(the GPU is synchronised before and after the timed steps only), and ms per step = its inverse x batch.

- Models: "tiny" = tiny_config() (8 layers, dim 128); "medium" = V41Config() widths (dim 5120, 64 heads x 512, 384
  routed experts top-6, index top-k 512, ...) cut to four layers by default (--layers): window-only, ratio-2 FULL,
  ratio-1 FULL (candidate source), ratio-1 REINDEX (bench_prefill.trimmed_config). Random weights in the checkpoint
  formats (FP8 blocks, packed FP4 experts) from build_random_weights on the device; the engine's V41Model runs them
  (mini-deepgemm, mini-flashmla on CUDA; their torch references on CPU).
- Context: the engine's prefill step is replaced by a synthetic one (bench_prefill.fill_cached_context: random
  packed rows for every cached entry, window ring, compressor tail and Engram history, as a real prefix leaves them),
  so a 64 x 8k context costs no prefill compute; decode steps run the real model. One engine per (batch, context)
  runs all variants in turn (its graphs are captured once, in the first graph variant's warm-up): ZOS is switched
  through the engine's config, graphs by giving the runner its DecodeGraphs or none.
- Host time per step: perf_counter around Scheduler.schedule, ModelRunner.execute (building the step's input,
  launching the forward, sampling and the copy-back: with graphs, mostly the input preparation) and
  LLMEngine._process minus its StepHandle.wait (the wait is reported apart: the time the host blocks on the GPU).
  GPU time per step: CUDA events before and after each execute, i.e. the span the step's work occupies on the
  stream (with eager launches that includes the gaps while the host is still launching).
  "CPU time hidden by ZOS" = ms per step with ZOS off - ms per step with ZOS on.
- Profile (optional): a few eager decode steps of the largest (batch, context) under torch.profiler: the
  heaviest kernels, and kernel time per stage with bench_prefill's stage ranges (prefill_stages), as run and, when
  --layers samples every mode of the real model (all of SAMPLE_LAYERS), weighted to the 40-layer model.

Usage:
  python3 benchmarks/bench_decode.py --preset tiny --out $OUT/decode_tiny.json
  python3 benchmarks/bench_decode.py --preset medium --out $OUT/decode_medium.json
  python3 benchmarks/bench_decode.py --preset smoke --device cpu --out /tmp/decode.json   # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from bench_prefill import (DENSE_ROUTES, MOE_ROUTES, SAMPLE_LAYERS, Clock, TimedRoles, environment,
                           fill_cached_context, log, real_layer_counts, select_moe_route, trimmed_config, write_json)
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.worker import model_runner
from mini_deepinfer.worker.forward_batch import ForwardBatch
from prefill_stages import OUTSIDE, attribute_profile, by_layer_and_path_ms, stage_ranges, stage_summary

MEDIUM_LAYERS = ("window", "r2-full", "r1-full", "r1-reindex")
PRESETS = {
    "tiny": {"config": lambda layers: tiny_config(), "batches": (1, 8, 32, 64), "contexts": (1024, 8192),
             "warmup": 3, "steps": 15},
    # an Engram layer's table at the real vocabulary is ~98 GB: bench_prefill's reduced one (its "real" preset)
    "medium": {"config": lambda layers: trimmed_config(V41Config(), layers, 100_000), "batches": (1, 8, 32, 64),
               "contexts": (1024, 8192), "warmup": 3, "steps": 15},
    "smoke": {"config": lambda layers: tiny_config(), "batches": (1, 2), "contexts": (150,), "warmup": 1, "steps": 2},
}
KV_CACHE_GB = 4.0


# --------------------------------------------------------------------------- the engine under test
def synthetic_prefill(model: V41Model, gen: torch.Generator) -> None:
    """Replace the model's prefill (any non-decode step) by filling the cache as that prefill would leave it;
    decode steps keep the real forward."""
    real_forward = model.forward

    def forward(batch: ForwardBatch, cache: V41Cache) -> torch.Tensor:
        if batch.is_decode:
            return real_forward(batch, cache)
        cache.reset_slots([s for s, c in zip(batch.slots, batch.context_lens) if c == 0], model.engram_pad)
        for q, c, table, slot in zip(batch.query_lens, batch.context_lens, batch.block_tables, batch.slots):
            fill_cached_context(cache, model, c + q, table, slot, gen)
        return torch.zeros(len(batch.sample_rows), model.config.vocab_size, device=model.device)

    model.forward = forward


class HostTimers:
    """Seconds spent in the engine's host phases (see the module docstring) and GPU spans of each execute."""

    def __init__(self, engine: LLMEngine, cuda: bool):
        self.engine, self.cuda = engine, cuda
        self.reset()

    def reset(self) -> None:
        self.seconds = {"schedule": 0.0, "execute": 0.0, "process": 0.0, "wait": 0.0}
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        eng = self.engine
        schedule, execute, process = eng.scheduler.schedule, eng.runner.execute, eng._process
        wait = model_runner.StepHandle.wait

        def timed(name, fn):
            def run(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.seconds[name] += time.perf_counter() - t0
            return run

        def gpu_spanned(step, prev):
            if not self.cuda:
                return execute(step, prev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            handle = execute(step, prev)
            end.record()
            self.events.append((start, end))
            return handle

        eng.scheduler.schedule = timed("schedule", schedule)
        eng.runner.execute = timed("execute", gpu_spanned)
        eng._process = timed("process", process)
        model_runner.StepHandle.wait = timed("wait", wait)
        try:
            yield
        finally:
            eng.scheduler.schedule, eng.runner.execute, eng._process = schedule, execute, process
            model_runner.StepHandle.wait = wait

    def gpu_ms(self) -> float | None:
        if not self.events:
            return None
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / len(self.events)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(engine: LLMEngine, graphs, batch: int, zos: bool, use_graphs: bool, warmup: int, steps: int,
                device: torch.device) -> dict:
    engine.config = dataclasses.replace(engine.config, enable_zos=zos)
    engine.runner.graphs = graphs if use_graphs else None
    for _ in range(warmup):
        engine.step()
    timers = HostTimers(engine, device.type == "cuda")
    preemptions = engine.scheduler.num_preemptions
    synchronize(device)
    with timers.installed():
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        synchronize(device)
        wall = time.perf_counter() - t0
    full_batch_steps(engine, batch, preemptions, "a timed variant")
    host = {k: 1e3 * v / steps for k, v in timers.seconds.items()}
    host["process"] -= host["wait"]  # _process includes the wait; keep only its own work
    ms = 1e3 * wall / steps
    return {"zos": zos, "cuda_graphs": use_graphs, "ms_per_step": ms, "output_tok_s": batch * steps / wall,
            "host_ms_per_step": host, "host_busy_ms": host["schedule"] + host["execute"] + host["process"],
            "gpu_ms_per_step": timers.gpu_ms()}


def full_batch_steps(engine: LLMEngine, batch: int, preemptions_before: int, what: str) -> None:
    """Fail unless all `batch` sequences are running and none was preempted since `preemptions_before`: tok/s is
    computed from the requested batch, so a KV budget too small for batch x context would report a smaller batch's
    steps as this one's (session 15 run 7: batch 64 at 131k in the default 4 GB, 7.20 ms/step, below batch 8)."""
    running = len(engine.scheduler.running)
    preempted = engine.scheduler.num_preemptions - preemptions_before
    if running != batch or preempted:
        raise SystemExit(f"bench_decode: {what} ran {running} of {batch} sequences with {preempted} preemptions: "
                         f"batch x context does not fit the KV budget; raise --kv-cache-gb")


def profile_eager_steps(engine: LLMEngine, model: V41Model, steps: int, device: torch.device) -> dict:
    """`steps` eager decode steps (ZOS off) under torch.profiler with the stage and layer ranges of bench_prefill's
    breakdown (prefill_stages): the kernels taking the most device time (CPU: the ops taking the most CPU time), and
    that time per headline stage, as run and (when every mode of the real model is sampled) weighted to the 40-layer
    model, in ms per step."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    engine.config = dataclasses.replace(engine.config, enable_zos=False)
    engine.runner.graphs = None
    # the layer loop iterates bench_prefill's TimedRoles: each layer in a range named after its sample layer
    roles, model.roles = model.roles, TimedRoles(model.roles, Clock(device))
    model.roles.ranges = True
    synchronize(device)
    try:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with stage_ranges(model) as missing, profile(activities=activities) as prof:
            for _ in range(steps):
                engine.step()
            synchronize(device)
    finally:
        model.roles = roles
    charged, kernels = attribute_profile(prof.events(), cuda)
    per_step = {key: us / steps for key, us in charged.items()}
    counts, n_engram = real_layer_counts()
    sampled = {layer for layer, _ in per_step if layer != OUTSIDE}
    summary = stage_summary(per_step, counts, n_engram)
    by_layer: dict[str, float] = {}
    for (layer, _), us in per_step.items():
        by_layer[layer] = by_layer.get(layer, 0.0) + us / 1e3
    return {
        "method": ("eager steps (ZOS and graphs off) under torch.profiler; record_function ranges around each layer "
                   "and the model's building blocks (prefill_stages); CUDA kernel time charged to the ranges open "
                   "at its launch; ms per step"),
        "steps": steps, "ranges_not_found": missing,
        "kernel_ms_per_step": kernels["total_us"] / 1e3 / steps,
        "stage_ms_per_step": summary["profiled_step_ms"],
        "forty_layer_ms_per_step": summary["forty_layer_ms"] if set(counts) <= sampled else None,
        "layer_ms_per_step": by_layer,
        "by_layer_and_path_ms_per_step": by_layer_and_path_ms(per_step),
        "top_kernels": [{**k, "us": k["us"] / steps, "calls": k["calls"] / steps} for k in kernels["top"]],
    }


def bench_engine(model: V41Model, batch: int, context: int, args, device: torch.device) -> dict:
    variants = [(zos, g) for g in ((True, False) if device.type == "cuda" else (False,)) for zos in (True, False)]
    per_variant = args.warmup + args.steps
    max_tokens = per_variant * len(variants) + 4 * args.warmup + 8
    max_model_len = context + max_tokens + 1
    cfg = EngineConfig(max_model_len=max_model_len, max_num_seqs=batch, max_num_batched_tokens=batch * max_model_len,
                       chunked_prefill=False, kv_cache_memory_gb=args.kv_cache_gb)
    engine = LLMEngine(model, V41Cache, cfg, device)
    graphs = engine.runner.graphs
    gen = torch.Generator().manual_seed(batch * 7919 + context)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(3, model.config.vocab_size, (context,), generator=gen).tolist(), params)
    t0 = time.perf_counter()
    while engine.scheduler.waiting or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()  # the synthetic prefill
    synchronize(device)
    full_batch_steps(engine, batch, 0, "the context fill")
    out = {"batch": batch, "context": context, "prefill_fill_s": time.perf_counter() - t0,
           "warmup_steps": args.warmup, "timed_steps": args.steps, "variants": []}
    for zos, use_graphs in variants:
        r = run_variant(engine, graphs, batch, zos, use_graphs, args.warmup, args.steps, device)
        out["variants"].append(r)
        log(f"batch {batch:3d} context {context:5d} zos={int(zos)} graphs={int(use_graphs)}: "
            f"{r['ms_per_step']:8.2f} ms/step {r['output_tok_s']:9.1f} tok/s, host busy {r['host_busy_ms']:.2f} ms "
            f"(wait {r['host_ms_per_step']['wait']:.2f}), gpu span {r['gpu_ms_per_step'] or 0:.2f} ms")
    by = {(v["zos"], v["cuda_graphs"]): v["ms_per_step"] for v in out["variants"]}
    out["zos_hidden_ms_per_step"] = {("graphs" if g else "eager"): by[(False, g)] - by[(True, g)]
                                     for g in {g for _, g in by}}
    if args.profile and batch == max(args.batches) and context == max(args.contexts):
        out["profile_eager"] = profile_eager_steps(engine, model, 3, device)
        log_stages(out["profile_eager"])
    for rid in list(engine._requests):
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv.all_free()
    return out


def log_stages(profile: dict) -> None:
    """The profile's stage table: ms per step as run, and weighted to the 40-layer model where available."""
    forty = profile["forty_layer_ms_per_step"] or {}
    print(f"stage (eager, profiled)   ms as run   ms x40   (kernels {profile['kernel_ms_per_step']:.2f} ms per step)")
    for stage, ms in profile["stage_ms_per_step"].items():
        print(f"{stage:24s} {ms:10.3f} {forty.get(stage, float('nan')):8.2f}")


# --------------------------------------------------------------------------- main
def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model options this script and bench_throughput share: --layers, --moe-route, --dense-route, --seed."""
    ap.add_argument("--layers", type=lambda s: tuple(s.split(",")), default=MEDIUM_LAYERS,
                    help=f"the medium preset's sample layers, comma-separated, of {','.join(SAMPLE_LAYERS)} (all of "
                         "them give bench_decode's --profile a 40-layer breakdown)")
    ap.add_argument("--moe-route", choices=MOE_ROUTES, default="fp8",
                    help="the FP4 experts' GEMM route: fp8 (the engine's) or bf16 (before session 20)")
    ap.add_argument("--dense-route", choices=DENSE_ROUTES, default="fold",
                    help="the dense FP8 linears: fold (the engine's, V3-recipe GEMMs) or v41 (before session 20)")
    ap.add_argument("--seed", type=int, default=0)


def random_model(cfg: V41Config, args: argparse.Namespace, device: torch.device) -> V41Model:
    """V41Model of cfg with random checkpoint-format weights from args.seed, on the routes add_model_args chose."""
    model = V41Model(cfg, build_random_weights(cfg, seed=args.seed, device=device), device,
                     fold_dense_fp8=args.dense_route == "fold")
    select_moe_route(model, args.moe_route)
    return model


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after each engine)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=lambda s: tuple(int(x) for x in s.split(",")))
    ap.add_argument("--contexts", type=lambda s: tuple(int(x) for x in s.split(",")))
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--profile", action="store_true", help="profile eager steps of the largest batch and context")
    ap.add_argument("--kv-cache-gb", type=float, default=KV_CACHE_GB, help="the engine's KV budget")
    add_model_args(ap)
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if key != "config" and getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    cfg = PRESETS[args.preset]["config"](args.layers)
    res = {"benchmark": "decode", "preset": args.preset, "environment": environment(device),
           "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "extra"},
           "dtype": "weights in the checkpoint formats (FP8 e4m3 blocks, packed FP4 experts), bf16 activations, "
                    "cache FP8 window / FP4 compressed KV and index keys, fp32 logits",
           "workload": {"batches": list(args.batches), "contexts": list(args.contexts), "warmup_steps": args.warmup,
                        "timed_steps": args.steps, "sampling": "greedy, ignore_eos",
                        "kv_cache_gb": args.kv_cache_gb, "moe_route": args.moe_route,
                        "dense_route": args.dense_route,
                        "layers": list(args.layers) if args.preset == "medium" else None},
           "results": []}
    log(f"building random weights of {cfg.num_hidden_layers} layers on {device}")
    t0 = time.perf_counter()
    model = random_model(cfg, args, device)
    synthetic_prefill(model, torch.Generator(device=device).manual_seed(args.seed))
    res["setup_s"] = {"weights_and_model": time.perf_counter() - t0}
    log(f"model ready in {res['setup_s']['weights_and_model']:.1f} s")
    for context in args.contexts:
        for batch in args.batches:
            res["results"].append(bench_engine(model, batch, context, args, device))
            write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()
