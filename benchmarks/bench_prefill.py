"""Prefill benchmark of real DeepSeek-V4.1-Flash layers (issue 8, first part): per-layer times, a 40-layer
equivalent, a per-stage profile and the FP8 matmul rate of the same run.

Workload (the seeds' official prefill setting, per rank): one sequence with a context of 131,072 tokens, of which
context - tokens = 126,976 are already cached, and tokens = 4,096 uncached tokens computed per step. Metric:
uncached input tokens/s per GPU and mean ms per step, over the measured steps after warm-up. --seqs N splits the
step's tokens over N sequences, each with tokens / N uncached tokens at the same context (N fresh prompts when
context = tokens / N): what a step of many requests costs beside one of one request. --mix gives each group of
sequences its own length and context (e.g. one long sequence beside many fresh prompts: a mixed step, where the
indexer's groups by entry count matter).

- Model: V41Config() (real widths) trimmed to one layer of each layer mode, in this order: window-only,
  window-only with Engram (engram_vocab_size reduced so the table fits; the real table is ~98 GB), ratio-2 FULL,
  ratio-2 REUSE, ratio-1 FULL (candidate source), ratio-1 REINDEX (restricted to the candidate blocks), ratio-1
  REUSE. Random weights in the checkpoint formats (FP8 blocks, packed FP4 experts, FP8 Engram table) come from
  build_random_weights on the device; the engine's V41Model runs them (mini-deepgemm / mini-flashmla on CUDA).
- Cached context: filled synthetically before the first step. Every KV-source layer gets packed random rows for all
  cached compressed entries (compressed KV and index keys), every layer's window ring the last 128 cached
  positions, the compressor tail and the Engram history the state a real prefix would leave. Random values are
  drawn as floats and packed with mini_flashmla.cache_layout (random bytes would not all be valid FP4 / FP8).
- Steps: each step is V41Model.forward on a ForwardBatch of the one sequence (context_len = context - tokens,
  query_len = tokens). The per-slot state a step changes (window rings, compressor tails, Engram history, index-key
  publisher) is restored from a snapshot before every step, so every step sees the same context.
- Per-layer times: model.roles is replaced by a list whose iterator marks each layer boundary of the model's layer
  loop (`for role in self.roles`) with a CUDA event (host clock on CPU, where execution is synchronous) and the host
  clock; the model itself is unchanged. Embedding, final norm and head make up the "outside layers" time. The
  timed steps run back to back, as under the engine's asynchronous scheduling: the host issues step i + 1 while the
  GPU runs step i, so a layer's time is its GPU time wherever the host keeps ahead (host_ms_mean per layer says how
  long the host took to issue it). --sync-steps waits for each step before the next (sessions <= 17), which
  starts every step on an idle GPU and charges the host's launch time of its first layers to them.
- 40-layer equivalent: sum over layer modes of (number of such layers in V41Config()) x (this run's time of the
  mode's sample layer), plus 2 x the Engram cost (window+engram layer minus window layer; the real model has
  Engram on layers 1 and 14), plus the outside-layers time.
- Per-stage breakdown: one extra step under torch.profiler with record_function ranges around the model's building
  blocks (projections, compressor, indexer, top-k, window cache, sparse attention, hc, norms, MoE routing /
  experts / dispatch-combine, Engram, head); each CUDA kernel is charged to the ranges enclosing its launch.
- FP8 rate: torch._scaled_mm with per-tensor scales at fp8-size^3 (cuBLAS), in the same process; the achieved
  fraction divides the benchmark's own FLOP count (layer_flops) by the time and by that rate.

Usage:
  python3 benchmarks/bench_prefill.py --out $OUT/prefill_h200.json                      # GPU, real widths
  python3 benchmarks/bench_prefill.py --device cpu --preset tiny --out /tmp/prefill.json  # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from mini_deepep import Buffer
from mini_deepinfer.distributed import init_torchrun_process_group
from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE, V41Cache
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import LayerMode, LayerRole, V41Config, tiny_config
from mini_deepinfer.models.deepseek_v41.engram import engram_table_sizes
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.models.deepseek_v41.ops import KernelWeights
from mini_deepinfer.models.deepseek_v41.parallel import ExpertParallelV41Model
from mini_deepinfer.worker.forward_batch import ForwardBatch
from mini_flashmla.cache_layout import pack_compressed_kv_fp4, pack_index_k_fp4, pack_window_fp8
from prefill_stages import (LAYER_RANGE, OUTSIDE, attribute_profile, by_layer_and_path_ms, host_by_stage,
                            host_summary, stage_ranges, stage_summary)

# One sample layer per layer mode, in model order; a name is mode_key(role) plus "+engram" for the Engram layer.
SAMPLE_LAYERS = ("window", "window+engram", "r2-full", "r2-reuse", "r1-full", "r1-reindex", "r1-reuse")
# A layer that reads another layer's compressed KV / top-k needs that layer in the same forward.
REQUIRES = {"r2-reuse": "r2-full", "r1-reindex": "r1-full", "r1-reuse": "r1-full"}

PRESETS = {
    # 10 timed steps after warm-up: the official workload's "10 complete steady-state steps" (issue 8)
    "real": {"base": V41Config, "tokens": 4096, "context": 131072, "warmup": 1, "steps": 10,
             "engram_vocab": 100_000, "fp8_size": 8192},
    # the smoke run: tiny_config() widths with 8 routed experts (its 32 take most of a CPU step); the context
    # still spans the window (128) and both selection levels (index_topk 16, 4 candidate blocks of 8)
    "tiny": {"base": lambda: dataclasses.replace(tiny_config(), n_routed_experts=8), "tokens": 32, "context": 256,
             "warmup": 1, "steps": 2, "engram_vocab": None, "fp8_size": 128},
}
FILL_CHUNK = 1 << 15  # cache rows drawn and packed at once while filling the cached context


_START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _START:7.1f} s] {msg}", flush=True)


# --------------------------------------------------------------------------- layer plan
def mode_key(role: LayerRole) -> str:
    """"window", or "r<ratio>-<full|reindex|reuse>": what decides a layer's cost apart from Engram."""
    return "window" if role.mode == LayerMode.WINDOW else f"r{role.ratio}-{role.mode.value}"


def sample_name(role: LayerRole) -> str:
    return mode_key(role) + ("+engram" if role.has_engram else "")


def real_layer_counts(config: V41Config | None = None) -> tuple[Counter, int]:
    """(layers per mode_key, number of Engram layers) of the real model: window 2, r2-full 3, r2-reuse 15,
    r1-full 1, r1-reindex 4, r1-reuse 15; Engram 2."""
    config = config or V41Config()
    return Counter(mode_key(r) for r in config.layer_roles), len(config.engram_layer_ids)


MOE_ROUTES = ("fp8", "bf16")
# --dense-route: "fold" (the engine's default: dense FP8 linears on the V3-recipe GEMMs, ops.KernelWeights) or "v41"
# (the V4.1 kernels, as before session 20)
DENSE_ROUTES = ("fold", "v41")


def select_moe_route(model: V41Model, route: str) -> None:
    """--moe-route: "fp8" keeps the engine's default, the FP4 experts on mini-deepgemm's FP8-MMA route where their
    scales fold (KernelWeights.fp4_folded); "bf16" drops the route (KernelWeights.drop_fp8_mma_route: the weights back
    in the checkpoint's order, the folded scales dropped), so the experts' GEMMs take the bf16-MMA route the engine
    used before session 20 (the before of docs/reports/deepgemm-fp8-moe.md's end-to-end rows)."""
    if route == "bf16" and isinstance(model.w, KernelWeights):
        model.w.drop_fp8_mma_route()


def trimmed_config(base: V41Config, layers: Sequence[str], engram_vocab: int | None) -> V41Config:
    """`base` with its widths, cut down to the sample layers named in `layers` (kept in SAMPLE_LAYERS order).

    engram_vocab: engram_vocab_size of the trimmed model (None keeps base's); the table sizes follow from it.
    """
    unknown = set(layers) - set(SAMPLE_LAYERS)
    if unknown:
        raise ValueError(f"unknown layers {sorted(unknown)}; choose from {', '.join(SAMPLE_LAYERS)}")
    for name, needed in REQUIRES.items():
        if name in layers and needed not in layers:
            raise ValueError(f"layer {name} needs {needed} in the same run")
    names = [n for n in SAMPLE_LAYERS if n in layers]
    lid = {n: i for i, n in enumerate(names)}
    kv_sources = tuple(lid[n] for n in ("r2-full", "r1-full") if n in lid)
    index_sources = tuple(sorted(kv_sources + ((lid["r1-reindex"],) if "r1-reindex" in lid else ())))
    cfg = dataclasses.replace(
        base,
        num_hidden_layers=len(names),
        compress_ratios=tuple(0 if n.startswith("window") else int(n[1]) for n in names),
        kv_source_layer_ids=kv_sources,
        index_source_layer_ids=index_sources,
        candidate_source_layer_id=lid.get("r1-full", -1),
        engram_layer_ids=(lid["window+engram"],) if "window+engram" in lid else (),
        engram_vocab_size=engram_vocab or base.engram_vocab_size,
        engram_num_embeddings=(),
    )
    if cfg.engram_layer_ids:
        cfg = dataclasses.replace(cfg, engram_num_embeddings=tuple(engram_table_sizes(cfg)))
    cfg.validate()
    got = [sample_name(r) for r in cfg.layer_roles]
    if got != names:
        raise AssertionError(f"trimmed config has layers {got}, wanted {names}")
    return cfg


# --------------------------------------------------------------------------- the cached context
def fill_cached_context(cache: V41Cache, model: V41Model, cached: int, block_table: list[int], slot: int,
                        gen: torch.Generator) -> None:
    """Write the state `cached` tokens of one sequence would leave in `cache`, with random values.

    Values are N(0, 1), the scale of the normalised latents, keys and window rows the model writes: compressed KV
    and index keys of entries 0 .. cached // ratio - 1 of every KV source; the window ring rows of positions
    max(0, cached - W) .. cached - 1 of every layer; the compressor tail of positions cached // r * r .. cached - 1
    (scores too); the Engram history (compressed ids of the last tokens); the index-key publisher a full forward
    leaves (the last KV source, spec 2.4).
    """
    cfg, dev = model.config, cache.device

    def write_random(dest: torch.Tensor, rows: torch.Tensor, pack, dim: int) -> None:
        for c0 in range(0, rows.shape[0], FILL_CHUNK):
            r = rows[c0:c0 + FILL_CHUNK]
            dest[r] = pack(torch.randn(r.shape[0], dim, generator=gen, device=dev))

    W = cfg.sliding_window
    window_pos = torch.arange(max(0, cached - W), cached, device=dev)
    for ring in cache.window.values():
        write_random(ring, slot * W + window_pos % W, pack_window_fp8, cfg.head_dim)
    for lid in cache.compressed_kv:
        r = cfg.compress_ratios[lid]
        rows = V41Cache.entry_rows(block_table, torch.arange(cached // r, device=dev), r)
        write_random(cache.compressed_kv[lid], rows, pack_compressed_kv_fp4, cfg.head_dim)
        write_random(cache.index_k[lid], rows, pack_index_k_fp4, cfg.index_head_dim)
    for lid, kv_state in cache.comp_kv_state.items():
        r = cfg.compress_ratios[lid]
        tail = torch.arange(cached // r * r, cached, device=dev) % r
        kv_state[slot, tail] = torch.randn(tail.shape[0], cfg.head_dim, generator=gen, device=dev)
        cache.comp_score_state[lid][slot, tail] = torch.randn(tail.shape[0], cfg.head_dim, generator=gen, device=dev)
    n_hist = cfg.engram_max_ngram_size - 1
    history = model.token_map[torch.randint(0, cfg.vocab_size, (n_hist,), generator=gen, device=dev)]
    history[: max(0, n_hist - cached)] = model.engram_pad  # look-backs before the sequence start
    cache.engram_history[slot] = history
    cache.index_k_publisher[slot] = max(cache.compressed_kv, default=-1)


class SlotSnapshot:
    """A copy of the per-slot state one step changes, written back before each step (the cached compressed KV
    and index-key rows are never overwritten: a step only appends entries, the same ones every step)."""

    def __init__(self, cache: V41Cache):
        self.cache = cache
        self.tensors = [(t, t.clone()) for t in itertools.chain(
            cache.window.values(), cache.comp_kv_state.values(), cache.comp_score_state.values(),
            [cache.engram_history])]
        self.publisher = list(cache.index_k_publisher)

    def restore(self) -> None:
        for live, saved in self.tensors:
            live.copy_(saved)
        self.cache.index_k_publisher[:] = self.publisher


# --------------------------------------------------------------------------- timing
class Clock:
    """Time marks on the GPU timeline (CUDA events: no synchronisation while marking) or, on CPU, where every op
    completes before the next starts, the host clock; and the host clock at each mark in both cases (how long the
    host took to issue each interval's work: where it is as long as the GPU time, the GPU waited for the host)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.host_marks: list[float] = []

    def mark(self) -> None:
        self.host_marks.append(time.perf_counter())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(self.host_marks[-1])

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in itertools.pairwise(self.marks)]
        return [(b - a) * 1e3 for a, b in itertools.pairwise(self.marks)]

    def host_intervals_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in itertools.pairwise(self.host_marks)]


class TimedRoles(list):
    """Stands in for model.roles: the model's layer loop iterates it, so each layer start and the loop's end are
    marked on `clock`; with `ranges` on, each layer is also a record_function range for the profiler. Indexing
    (model._indexer reads roles[publisher]) behaves as the plain list."""

    def __init__(self, roles: list[LayerRole], clock: Clock):
        super().__init__(roles)
        self.clock = clock
        self.ranges = False

    def __iter__(self) -> Iterator[LayerRole]:
        for role in super().__iter__():
            self.clock.mark()
            label = f"{LAYER_RANGE}{sample_name(role)}"
            with torch.profiler.record_function(label) if self.ranges else contextlib.nullcontext():
                yield role
        self.clock.mark()


def run_step(model: V41Model, cache: V41Cache, batch: ForwardBatch, snapshot: SlotSnapshot
             ) -> tuple[Clock, torch.Tensor]:
    """One forward from the cached context, issued and not waited for. Returns (a clock of its own holding the step's
    marks: GPU / host ms of [outside before, layer 0, ..., layer L-1, outside after], logits)."""
    clock = model.roles.clock = Clock(batch.input_ids.device)
    snapshot.restore()
    clock.mark()
    logits = model(batch, cache)
    clock.mark()
    if len(clock.marks) != len(model.roles) + 3:
        raise RuntimeError(f"expected {len(model.roles) + 3} time marks per step, got {len(clock.marks)}: the model "
                           "no longer iterates self.roles exactly once per forward; update TimedRoles")
    return clock, logits


def sync_report(model: V41Model, cache: V41Cache, batch: ForwardBatch, snapshot: SlotSnapshot) -> dict:
    """One extra step under torch.cuda.set_sync_debug_mode("warn"): every operation that makes the host wait for
    the GPU (a device-to-host copy, .item(), a data-dependent shape), counted by the source line that called it. A
    layer whose host time (host_ms_mean) reaches its GPU time has the GPU waiting for launches; these lines say
    where the host stopped to wait."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step = run_step(model, cache, batch, snapshot)[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    step.intervals_ms()  # the GPU done with it before the next phase
    sites = Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in caught
                    if "synchroniz" in str(w.message))
    return {"method": "torch.cuda.set_sync_debug_mode('warn') over one step; warnings counted by source line",
            "synchronizing_calls": sum(sites.values()), "by_line": dict(sites.most_common())}


# --------------------------------------------------------------------------- per-stage profile
def profile_step(model, cache, batch, snapshot, cuda: bool) -> dict:
    """One step under torch.profiler with the layer and stage ranges on; the stage breakdown for the JSON."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    model.roles.ranges = True
    try:
        with stage_ranges(model) as missing, torch.profiler.profile(activities=activities) as prof:
            run_step(model, cache, batch, snapshot)[0].intervals_ms()  # waits: every kernel inside the profile
    finally:
        model.roles.ranges = False
    events = prof.events()
    charged, kernels = attribute_profile(events, cuda)
    counts, n_engram = real_layer_counts()
    return {
        "method": ("one extra step under torch.profiler; record_function ranges around the model's building blocks; "
                   "CUDA kernel time (CPU: self CPU time) charged to the ranges open when the kernel was launched"),
        "ranges_not_found": missing,
        "summary": stage_summary(charged, counts, n_engram),
        "host_as_run": host_summary(host_by_stage(events)),
        "by_layer_and_path_ms": by_layer_and_path_ms(charged),
        "kernels": kernels,
    }


def python_profile(model, cache, batch, snapshot, top: int) -> dict:
    """One extra step under cProfile: the Python functions in which the host spends its time issuing a step (the
    GPU is waited for only after the profile stops). Where a layer's host_ms_mean reaches its GPU time, these are
    what to cut. cProfile slows the host ~2x; compare functions with each other, not with the timed steps."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    step = run_step(model, cache, batch, snapshot)[0]
    prof.disable()
    step.intervals_ms()

    def where(func: tuple[str, int, str]) -> str:
        path, line, name = func
        return name if path == "~" else f"{os.path.relpath(path)}:{line}({name})"

    rows = [{"function": where(f), "calls": nc, "own_ms": tt * 1e3, "cumulative_ms": ct * 1e3}
            for f, (_, nc, tt, ct, _) in pstats.Stats(prof).stats.items()]
    return {"method": "cProfile over one step's issue (host only); top functions by own and by cumulative time",
            "total_own_ms": sum(r["own_ms"] for r in rows),
            "by_own_time": sorted(rows, key=lambda r: -r["own_ms"])[:top],
            "by_cumulative_time": sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]}


# --------------------------------------------------------------------------- FLOPs and the FP8 rate
def layer_flops(cfg: V41Config, role: LayerRole, tokens: int, cached: int) -> dict[str, int]:
    """Matmul FLOPs (2 per multiply-add) of one layer's forward over query positions cached .. cached+tokens-1.

    Counted as the math needs them, not as the kernels happen to run: attention over the valid window and
    top-k slots of each query (QK and PV), indexer scores over each query's visible compressed entries,
    routed experts at k experts per token. Element-wise work, RoPE, quantization and softmax are left out. A REINDEX
    layer scores only its candidate blocks' entries (since session 29 as run, too; before, every visible entry
    was scored and these layers' FLOPs were counted that way).
    """
    T, D, H, hd = tokens, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    pos = torch.arange(cached, cached + tokens, dtype=torch.int64)
    r = role.ratio
    window_keys = int((pos + 1).clamp(max=cfg.sliding_window).sum())
    visible = (pos + 1) // r if r else torch.zeros_like(pos)
    topk_keys = int(visible.clamp(max=cfg.index_topk).sum())
    hc_dim = cfg.hc_mult * D
    f = {
        "hc": 2 * 2 * T * hc_dim * cfg.hc_mix_dim,
        "projections": 2 * T * (D * cfg.q_lora_rank + cfg.q_lora_rank * H * hd + D * hd + H * hd * cfg.o_lora_rank
                                + cfg.o_groups * cfg.o_lora_rank * D),
        "attention": 4 * H * hd * (window_keys + topk_keys),
        "moe": 2 * T * D * cfg.n_routed_experts
        + 6 * T * D * cfg.moe_intermediate_size * (cfg.num_experts_per_tok + cfg.n_shared_experts),
    }
    if role.mode == LayerMode.FULL:
        new_entries = (cached + tokens) // r - cached // r
        f["compressor"] = 2 * T * D * hd * (2 if r > 1 else 1) + 2 * new_entries * hd * cfg.index_head_dim
    if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
        nh, ihd = cfg.index_n_heads, cfg.index_head_dim
        scored = visible.clamp(max=cfg.candidate_topk_blocks * cfg.candidate_block_size) if role.uses_candidates \
            else visible
        f["indexer"] = 2 * T * (cfg.q_lora_rank * nh * ihd + D * nh) + 2 * nh * ihd * int(scored.sum())
    if role.has_engram:
        f["engram"] = 2 * T * cfg.engram_dim * (hc_dim + D)
    return f


def fp8_matmul_rate(n: int, device: torch.device, iters: int) -> dict:
    """TFLOP/s of torch._scaled_mm (e4m3 x e4m3 -> bf16, per-tensor scales) at n x n x n, median of `iters`."""
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLAS wants
    one = torch.ones((), device=device)
    times = []
    for i in range(iters + 2):  # two warm-up calls
        clock = Clock(device)
        clock.mark()
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        clock.mark()
        if i >= 2:
            times.append(clock.intervals_ms()[0])
    ms = sorted(times)[len(times) // 2]
    return {"n": n, "iters": iters, "median_ms": ms, "tflops": 2 * n**3 / ms / 1e9}


# --------------------------------------------------------------------------- environment and output
def environment(device: torch.device) -> dict:
    env = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        env["git_commit"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env["hardware"] = {"gpu": p.name, "gpus_used": int(os.environ.get("WORLD_SIZE", "1")), "gpus_visible": torch.cuda.device_count(),
                           "sms": p.multi_processor_count, "memory_gb": p.total_memory / 1e9}
    else:
        env["hardware"] = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    return env


def step_flops(cfg: V41Config, role: LayerRole, seqs: Sequence[tuple[int, int]]) -> dict[str, int]:
    """layer_flops summed over a step's sequences, each given as (uncached tokens, context)."""
    total: dict[str, int] = {}
    for q, context in seqs:
        for part, f in layer_flops(cfg, role, q, context - q).items():
            total[part] = total.get(part, 0) + f
    return total


def weighted_equivalent(per_layer: dict[str, float], outside: float, counts: Counter, n_engram: int
                        ) -> float | None:
    """The 40-layer combination (see the module docstring) of per-sample-layer values; None if a layer mode is
    missing from this run. Without the window+engram layer the Engram term is left out (see engram_included)."""
    if any(k not in per_layer for k in counts):
        return None
    engram = per_layer["window+engram"] - per_layer["window"] if "window+engram" in per_layer else 0.0
    return sum(counts[k] * per_layer[k] for k in counts) + n_engram * engram + outside


def print_table(res: dict) -> None:
    w, eq = res["workload"], res["forty_layer_equivalent"]
    hw = res["environment"]["hardware"]
    print(f"\nprefill  {hw.get('gpu', hw.get('cpu'))}  preset {w['preset']}  tokens {w['tokens']} in "
          f"{w['sequences']} sequences  " + (f"mix {w['mix']}" if w.get("mix") else
                                              f"context {w['context']} ({w['cached']} cached)")
          + f"  {w['steps']} steps after "
          f"{w['warmup']} warm-up")
    print(f"{'layer':>5} {'mode':<14} {'ms mean':>9} {'ms min':>9} {'host ms':>8} {'TFLOP':>8} {'TFLOP/s':>8} "
          f"{'x40':>4}")
    for lay in res["layers"]:
        print(f"{lay['layer_id']:>5} {lay['name']:<14} {lay['ms_mean']:>9.2f} {lay['ms_min']:>9.2f} "
              f"{lay['host_ms_mean']:>8.2f} {lay['tflop']:>8.3f} {lay['tflops_per_s']:>8.1f} {lay['count_in_40']:>4}")
    print(f"{'':>5} {OUTSIDE:<14} {res['outside_layers_ms']:>9.2f}")
    run = res["step_as_run"]
    print(f"step as run ({len(res['layers'])} layers): {run['ms_mean']:.1f} ms, {run['tokens_per_s']:,.0f} tok/s")
    if eq["ms_per_step"] is None:
        print("40-layer equivalent: not computed (a layer mode is missing from --layers)")
    else:
        fp8 = res["fp8_matmul"]
        print(f"40-layer equivalent{'' if eq['engram_included'] else ' WITHOUT Engram'}: "
              f"{eq['ms_per_step']:.1f} ms/step, {eq['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, "
              f"{eq['tflops_per_s']:.1f} TFLOP/s = {100 * eq['fraction_of_fp8_rate']:.1f}% of _scaled_mm "
              f"{fp8['tflops']:.1f} TFLOP/s")
    report = res.get("sync_report")
    if report:
        print(f"host-synchronizing calls in one step: {report['synchronizing_calls']}")
        for line, n in list(report["by_line"].items())[:12]:
            print(f"  {n:>5}  {line}")
    py = res.get("py_profile")
    if py:
        print(f"host functions (cProfile, one step, {py['total_own_ms']:.1f} ms own time in all)")
        for key, label in (("by_own_time", "own"), ("by_cumulative_time", "cumulative")):
            print(f"{'calls':>7} {'own ms':>8} {'cum ms':>8}  by {label} time")
            for r in py[key]:
                print(f"{r['calls']:>7} {r['own_ms']:>8.2f} {r['cumulative_ms']:>8.2f}  {r['function']}")
    stages = res.get("stages")
    if stages:
        host = stages.get("host_as_run", {"host_ms": {}, "launches": {}})
        print(f"{'stage (profiled step)':<24} {'ms as run':>10} {'ms x40':>10} {'host ms':>8} {'launches':>8}")
        for g, ms in stages["summary"]["profiled_step_ms"].items():
            print(f"{g:<24} {ms:>10.2f} {stages['summary']['forty_layer_ms'][g]:>10.2f} "
                  f"{host['host_ms'].get(g, 0.0):>8.2f} {host['launches'].get(g, 0):>8}")


def write_json(path: Path, res: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="result JSON (rewritten after each phase)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="real",
                    help="real: V41Config() widths; tiny: tiny_config() widths (CPU smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, help="uncached tokens per step (real 4096)")
    ap.add_argument("--context", type=int, help="context length including this step's tokens (real 131072)")
    ap.add_argument("--seqs", type=int, default=1,
                    help="sequences per step, tokens / seqs uncached tokens each, every one at --context")
    ap.add_argument("--mix", metavar="NxT@C,...",
                    help="a mixed step instead of --tokens / --context / --seqs: N sequences of T uncached tokens at a "
                         "context of C tokens each, per comma-separated group (e.g. 1x2048@131072,32x64@64)")
    ap.add_argument("--warmup", type=int, help="steps run before timing (Triton compiles here)")
    ap.add_argument("--steps", type=int, help="timed steps")
    ap.add_argument("--layers", default=",".join(SAMPLE_LAYERS), help="comma list of: " + ", ".join(SAMPLE_LAYERS))
    ap.add_argument("--engram-vocab", type=int, help="engram_vocab_size of the Engram layer (real 100000)")
    ap.add_argument("--fp8-size", type=int, help="n of the n^3 _scaled_mm rate measurement (real 8192)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled step")
    ap.add_argument("--sync-steps", action="store_true",
                    help="wait for each timed step before issuing the next (the method of sessions <= 17)")
    ap.add_argument("--sync-report", action="store_true",
                    help="CUDA: one extra step counting the host-synchronizing calls by source line (sync_report)")
    ap.add_argument("--py-profile", type=int, default=0, metavar="TOP",
                    help="one extra step under cProfile: the TOP host functions by own and cumulative time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--moe-route", choices=MOE_ROUTES, default="fp8",
                    help="the FP4 experts' GEMM route: fp8 (the engine's) or bf16 (before session 20)")
    ap.add_argument("--dense-route", choices=DENSE_ROUTES, default="fold",
                    help="the dense FP8 linears: fold (the engine's, V3-recipe GEMMs) or v41 (before session 20)")
    ap.add_argument("--sweep", type=lambda v: [int(t) for t in v.split(",")], default=[],
                    help="comma list of uncached token counts for the Pareto sweep (after the main run)")
    ap.add_argument("--no-main", action="store_true", help="skip the main run (with --sweep: the sweep only)")
    ap.add_argument("--bounded-replay", type=lambda v: [int(t) for t in v.split(",")], default=[],
                    help="comma list of prefill_keep_tokens values timed after the main run (decoder bounded replay; "
                         "the headline stays full replay)")
    ap.add_argument("--ep-backend", default="auto", choices=["auto", "nvshmem", "torch"],
                    help="under torchrun (EP x DP, one GPU per rank): mini-deepep's buffer backend")
    args = ap.parse_args(argv)
    args.buffer, args.rank = None, 0
    for key, value in PRESETS[args.preset].items():
        if key != "base" and getattr(args, key) is None:
            setattr(args, key, value)
    args.mix_seqs = None
    if args.mix is not None:
        if args.seqs != 1 or args.sweep:
            ap.error("--mix sets the step's sequences: no --seqs or --sweep with it")
        try:
            args.mix_seqs = parse_mix(args.mix)
        except ValueError as e:
            ap.error(str(e))
        args.tokens, args.context = sum(q for q, _ in args.mix_seqs), max(c for _, c in args.mix_seqs)
    elif args.seqs < 1 or args.tokens % args.seqs:
        ap.error("need seqs >= 1 dividing tokens")
    elif not 0 < args.tokens // args.seqs <= args.context:
        ap.error("need 0 < tokens / seqs <= context")
    if args.steps < 1 or args.warmup < 0:
        ap.error("need steps >= 1 and warmup >= 0")
    return args


def build(args: argparse.Namespace, device: torch.device, res: dict):
    """The trimmed model with random weights, its cache filled up to the cached context, the step's batch."""
    cfg = trimmed_config(PRESETS[args.preset]["base"](), res["workload"]["layers"], args.engram_vocab)
    res["config"] = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "extra"}
    log(f"building random weights of {cfg.num_hidden_layers} layers on {device}")
    t0 = time.perf_counter()
    weights = build_random_weights(cfg, seed=args.seed, device=device)  # every rank the same (same seed)
    fold = args.dense_route == "fold"
    if args.buffer is None:
        model = V41Model(cfg, weights, device, fold_dense_fp8=fold)
    else:  # EP x DP: this rank keeps its routed experts; the MoE dispatches and combines over the group
        model = ExpertParallelV41Model(cfg, weights, args.buffer, device, fold_dense_fp8=fold)
    del weights
    select_moe_route(model, args.moe_route)
    model.roles = TimedRoles(model.roles, Clock(device))
    t1 = time.perf_counter()
    cache, batch, snapshot = build_context(args, model, device)
    res["setup_s"] = {"weights_and_model": t1 - t0, "cache_fill": time.perf_counter() - t1}
    log(f"weights + model {t1 - t0:.1f} s, cache fill {time.perf_counter() - t1:.1f} s"
        + (f", {torch.cuda.memory_allocated(device) / 1e9:.1f} GB allocated" if device.type == "cuda" else ""))
    return model, cache, batch, snapshot


def parse_mix(spec: str) -> list[tuple[int, int]]:
    """--mix "NxT@C,...": (uncached tokens, context) of each sequence, N of each group in order."""
    seqs = []
    for group in spec.split(","):
        try:
            count, rest = group.split("x")
            tokens, context = rest.split("@")
            n, q, c = int(count), int(tokens), int(context)
        except ValueError:
            raise ValueError(f"mix group {group!r} is not NxT@C (N sequences of T tokens at C)") from None
        if n < 1 or not 0 < q <= c:
            raise ValueError(f"mix group {group!r}: need N >= 1 and 0 < T <= C")
        seqs += [(q, c)] * n
    return seqs


def step_sequences(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(uncached tokens, context) of each of the step's sequences: --mix's, or args.seqs equal ones."""
    return args.mix_seqs or [(args.tokens // args.seqs, args.context)] * args.seqs


def cached_tokens(args: argparse.Namespace) -> list[int]:
    """Positions each sequence has cached before the step."""
    return [context - q for q, context in step_sequences(args)]


def build_context(args: argparse.Namespace, model: V41Model, device: torch.device):
    """A cache holding each sequence's cached positions (cached_tokens(args); slots 1 .., blocks 1 ..: slot and
    block 0 are the model's sentinels), and the step's batch."""
    cfg = model.config
    seqs = step_sequences(args)
    n_blocks = [-(-context // BLOCK_SIZE) for _, context in seqs]
    cache = V41Cache(cfg, num_blocks=sum(n_blocks) + 1, num_slots=len(seqs) + 1, device=device)
    starts = list(itertools.accumulate(n_blocks, initial=1))
    tables = [list(range(a, b)) for a, b in zip(starts, starts[1:])]
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + 1000 * args.rank)  # DP: each rank its own sequences
    cached = cached_tokens(args)
    for i, table in enumerate(tables):
        fill_cached_context(cache, model, cached[i], table, 1 + i, gen)
    snapshot = SlotSnapshot(cache)
    ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen, device=device)
    query_lens = [q for q, _ in seqs]
    batch = ForwardBatch(ids, query_lens, cached, tables, list(range(1, len(seqs) + 1)),
                         [end - 1 for end in itertools.accumulate(query_lens)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return cache, batch, snapshot


def bounded_replay_run(args: argparse.Namespace, model: V41Model, cache: V41Cache, batch: ForwardBatch,
                       snapshot: SlotSnapshot, res: dict, keep: int) -> dict:
    """The main workload with decoder bounded replay (model.prefill_keep_tokens = keep): per-layer times and the
    40-layer equivalent, and how far the last token's logits move from full replay's (max |diff|)."""
    full = run_step(model, cache, batch, snapshot)[1]
    model.prefill_keep_tokens = keep
    try:
        part = {"fp8_matmul": res["fp8_matmul"]}
        time_steps(args, model, cache, batch, snapshot, part)
        bounded = run_step(model, cache, batch, snapshot)[1]
    finally:
        model.prefill_keep_tokens = None
    eq = part["forty_layer_equivalent"]
    log(f"bounded replay keep {keep}: {eq['ms_per_step']:.1f} ms/step, {eq['tokens_per_s_per_gpu']:,.0f} tok/s/GPU")
    return {"keep_tokens": keep, "ms_per_step": eq["ms_per_step"], "tokens_per_s_per_gpu": eq["tokens_per_s_per_gpu"],
            "layers_ms_mean": {lay["name"]: lay["ms_mean"] for lay in part["layers"]},
            "last_token_logits_max_abs_diff_vs_full_replay": (bounded - full).abs().max().item()}


def sweep_tokens(args: argparse.Namespace, model: V41Model, device: torch.device, res: dict) -> None:
    """The Pareto sweep: the same model and context length at each uncached-token count of --sweep (a fresh
    cache per count, args.warmup + args.steps steps each); per count the 40-layer ms/step and tok/s/GPU."""
    res["sweep"] = []
    for tokens in args.sweep:
        sub = argparse.Namespace(**{**vars(args), "tokens": tokens})
        part = {"fp8_matmul": res["fp8_matmul"]}
        cache = batch = snapshot = None  # bound even when build_context itself runs out of memory
        try:
            cache, batch, snapshot = build_context(sub, model, device)
            time_steps(sub, model, cache, batch, snapshot, part)
            eq = part["forty_layer_equivalent"]
            row = {"tokens": tokens, "ms_per_step": eq["ms_per_step"], "tokens_per_s_per_gpu": eq["tokens_per_s_per_gpu"],
                   "fraction_of_fp8_rate": eq["fraction_of_fp8_rate"], "layers_ms_mean": {
                       lay["name"]: lay["ms_mean"] for lay in part["layers"]}, "peak_memory_gb": part.get("peak_memory_gb")}
            log(f"sweep {tokens} tokens: {row['ms_per_step']:.1f} ms/step, {row['tokens_per_s_per_gpu']:,.0f} tok/s/GPU")
        except torch.OutOfMemoryError as e:  # recorded, not fatal: the sweep says where memory runs out
            if dist.is_initialized():  # EP x DP: the other ranks would wait in a collective forever; end the job
                raise
            row = {"tokens": tokens, "error": f"out of memory: {str(e).splitlines()[0]}"}
            log(f"sweep {tokens} tokens: out of memory")
        res["sweep"].append(row)
        del cache, batch, snapshot
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        write_json(args.out, res)


def time_steps(args: argparse.Namespace, model: V41Model, cache: V41Cache, batch: ForwardBatch,
               snapshot: SlotSnapshot, res: dict) -> None:
    """Warm-up and timed steps; per-layer times, the 40-layer equivalent and FLOP rates into `res`."""
    res["warmup_step_ms"] = []  # the first includes Triton compilation
    for i in range(args.warmup):
        res["warmup_step_ms"].append(sum(run_step(model, cache, batch, snapshot)[0].intervals_ms()))
        log(f"warm-up step {i}: {res['warmup_step_ms'][-1]:.1f} ms")
    # Timed steps back to back (the host issues step i + 1 while the GPU runs step i, as the engine's asynchronous
    # scheduling does), or with --sync-steps each waited for before the next is issued (sessions <= 17: every
    # step then starts on an idle GPU, so its first layers wait for the host's launches)
    clocks, logits = [], []
    for _ in range(args.steps):
        step, out = run_step(model, cache, batch, snapshot)
        if args.sync_steps:
            step.intervals_ms()  # waits for the step
        clocks.append(step)
        logits.append(out)
    steps_ms = [step.intervals_ms() for step in clocks]
    host_ms = [step.host_intervals_ms() for step in clocks]
    for i, (ms, host) in enumerate(zip(steps_ms, host_ms)):
        log(f"timed step {args.warmup + i}: {sum(ms):.1f} ms (host {sum(host):.1f} ms)")
    cfg, roles = model.config, list(model.roles)
    counts, n_engram = real_layer_counts()
    names = [sample_name(r) for r in roles]
    per_step = torch.tensor(steps_ms)  # [steps, 1 + layers + 1]: outside before, layers, outside after
    mean = per_step.mean(0).tolist()
    host_mean = torch.tensor(host_ms).mean(0).tolist()
    outside = mean[0] + mean[-1]
    by_part = [step_flops(cfg, r, step_sequences(args)) for r in roles]
    flops = {n: sum(parts.values()) for n, parts in zip(names, by_part)}
    res["layers"] = [{
        "layer_id": r.layer_id, "name": n, "ms_mean": mean[1 + i], "ms_min": per_step[:, 1 + i].min().item(),
        "host_ms_mean": host_mean[1 + i],
        "ms_per_step": per_step[:, 1 + i].tolist(), "flops": parts,
        "tflop": flops[n] / 1e12, "tflops_per_s": flops[n] / mean[1 + i] / 1e9, "count_in_40": counts.get(n, 0),
    } for i, (n, r, parts) in enumerate(zip(names, roles, by_part))]
    res["outside_layers_ms"] = outside
    step_mean = per_step.sum(1).mean().item()
    res["step_as_run"] = {"ms_mean": step_mean, "ms_per_step": per_step.sum(1).tolist(),
                          "tokens_per_s": args.tokens / step_mean * 1e3}
    eq_ms = weighted_equivalent(dict(zip(names, mean[1:-1])), outside, counts, n_engram)
    head_flops = 2 * cfg.hidden_size * cfg.vocab_size  # one sampled row
    eq_flops = weighted_equivalent(flops, head_flops, counts, n_engram)
    known = eq_ms is not None
    res["forty_layer_equivalent"] = {
        "method": "sum over modes of count x sample-layer ms + n_engram x (window+engram - window) + outside",
        "counts": dict(counts), "engram_layers": n_engram, "engram_included": "window+engram" in flops,
        "ms_per_step": eq_ms,
        "tokens_per_s_per_gpu": args.tokens / eq_ms * 1e3 if known else None,
        "tflop_per_step": eq_flops / 1e12 if known else None,
        "tflops_per_s": eq_flops / eq_ms / 1e9 if known else None,
        "fraction_of_fp8_rate": eq_flops / eq_ms / 1e9 / res["fp8_matmul"]["tflops"] if known else None,
    }
    res["checks"] = {"max_abs_logit_diff_first_vs_last_step": (logits[0] - logits[-1]).abs().max().item()}
    if batch.input_ids.is_cuda:
        res["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    ep_size = int(os.environ.get("WORLD_SIZE", "1"))  # launched by torchrun: EP x DP over the ranks
    if ep_size > 1:
        return main_ep(args, ep_size)
    return run(args, torch.device(args.device))


def main_ep(args: argparse.Namespace, ep_size: int) -> dict:
    """EP x DP under torchrun: every rank runs its own sequence (DP) through the same layers, routed experts split
    over the ranks (EP); steps run in lockstep (the MoE's dispatch/combine are collectives). Each rank writes its
    own JSON (--out with .rank<r> before the suffix) and prints its table; tok/s/GPU is per rank."""
    device = init_torchrun_process_group(args.device)
    args.rank = dist.get_rank()
    args.out = args.out.with_suffix(f".rank{args.rank}{args.out.suffix}")
    cfg = trimmed_config(PRESETS[args.preset]["base"](), args.layers.split(","), args.engram_vocab)
    nvl_bytes = Buffer.get_nvl_buffer_size_hint(max([args.tokens, *args.sweep]), cfg.hidden_size,
                                                cfg.num_experts_per_tok, ep_size) if device.type == "cuda" else 0
    try:
        with Buffer(None, nvl_bytes, backend=args.ep_backend) as buffer:
            args.buffer = buffer
            res = run(args, device)
            res["workload"]["ep_size"] = ep_size
            res["workload"]["ep_backend"] = buffer.backend_name
            res["workload"]["rank"] = args.rank
            write_json(args.out, res)
            return res
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device) -> dict:
    """One process's benchmark: the main run (per-layer times, 40-layer equivalent, profile), then the sweep."""
    res: dict = {"environment": environment(device), "workload": {
        "preset": args.preset, "tokens": args.tokens, "context": args.context, "cached": max(cached_tokens(args)),
        "warmup": args.warmup, "steps": args.steps, "sequences": len(step_sequences(args)), "mix": args.mix,
        "seed": args.seed, "ep_size": 1,
        "layers": args.layers.split(","), "moe_route": args.moe_route,
        "dense_route": args.dense_route,
    }}
    try:  # the JSON is rewritten after every phase, so a failure or a timeout keeps what was measured
        log(f"FP8 matmul rate at {args.fp8_size}^3")
        res["fp8_matmul"] = fp8_matmul_rate(args.fp8_size, device, iters=10 if device.type == "cuda" else 2)
        write_json(args.out, res)
        model, cache, batch, snapshot = build(args, device, res)
        if not args.no_main:
            time_steps(args, model, cache, batch, snapshot, res)
            write_json(args.out, res)
            if args.sync_report and device.type == "cuda":
                res["sync_report"] = sync_report(model, cache, batch, snapshot)
                write_json(args.out, res)
            if args.py_profile:
                res["py_profile"] = python_profile(model, cache, batch, snapshot, args.py_profile)
                write_json(args.out, res)
            if not args.no_profile:
                log("profiled step")
                res["stages"] = profile_step(model, cache, batch, snapshot, device.type == "cuda")
                write_json(args.out, res)
                log("profile done")
            for keep in args.bounded_replay:
                res.setdefault("bounded_replay", {})[str(keep)] = bounded_replay_run(
                    args, model, cache, batch, snapshot, res, keep)
                write_json(args.out, res)
        del cache, batch, snapshot
        if args.sweep:
            sweep_tokens(args, model, device, res)
    except Exception:
        res["error"] = traceback.format_exc()
        write_json(args.out, res)
        raise
    if not args.no_main:
        print_table(res)
    for keep, row in res.get("bounded_replay", {}).items():
        print(f"bounded replay keep {keep}: {row['ms_per_step']:.1f} ms/step, {row['tokens_per_s_per_gpu']:,.0f} "
              f"tok/s/GPU, last-token logits max |diff| vs full replay {row['last_token_logits_max_abs_diff_vs_full_replay']:.4g}")
    for row in res.get("sweep", []):
        print(f"sweep {row['tokens']:>6} tokens: " + (row["error"] if "error" in row else
              f"{row['ms_per_step']:9.1f} ms/step {row['tokens_per_s_per_gpu']:9,.0f} tok/s/GPU"))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
