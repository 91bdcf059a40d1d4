"""The per-stage breakdown of bench_prefill.py: record_function ranges around the V4.1 model's building blocks and
the attribution of a torch.profiler trace to them (by layer and stage path).

Ranges are named LAYER_RANGE + sample layer name (opened by bench_prefill.TimedRoles) and STAGE_RANGE + stage
label (opened by the wrappers of `stage_ranges`). A stage path joins the labels of the nested stage ranges, outer
first ("moe/experts/linear"); `summary_group` maps a path to a headline stage.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter, defaultdict
from collections.abc import Iterator

import torch
from mini_deepinfer.layers import hyper_connections as hc_fused
from mini_deepinfer.models.deepseek_v41 import model as model_module
from mini_deepinfer.models.deepseek_v41 import moe as moe_module
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.model import V41Model

try:  # the fused norm (session 30). A same-run A/B puts an older tree's src first on the path; there every norm runs
    # through ops.rmsnorm, a target of its own, so the fused one is simply not a target
    from mini_deepinfer.layers import rmsnorm as norm_fused
except ImportError:
    norm_fused = None

LAYER_RANGE, STAGE_RANGE = "layer::", "stage::"  # record_function name prefixes read back from the profile
OUTSIDE = "outside layers"  # embedding, final norm, head, per-step bookkeeping


def _stage_targets(model: V41Model) -> list[tuple[object, str, str]]:
    """(owner, attribute, stage label): the functions the model calls through a module or instance attribute,
    so that replacing the attribute wraps every call."""
    return [
        (ops, "attention_qkv", "projections"),
        (ops, "attention_output", "projections"),
        (ops, "indexer_queries", "queries"),
        (ops, "hc_mixes", "hc"),
        (ops, "hc_collapse", "hc"),
        (ops, "hc_expand", "hc"),
        (hc_fused, "hc_mixes_fused", "hc"),
        (hc_fused, "hc_collapse_fused", "hc"),
        (hc_fused, "hc_expand_fused", "hc"),
        (ops, "hc_expand_collapse", "hc"),
        (hc_fused, "hc_expand_collapse_fused", "hc"),
        (ops, "rmsnorm", "norm"),
        *([(norm_fused, "rmsnorm_fused", "norm")] if norm_fused is not None else []),
        (ops, "linear", "linear"),
        (model, "_moe", "moe"),
        (ops, "moe_route", "routing"),
        (moe_module, "contiguous_plan", "layout"),
        (moe_module, "masked_plan", "layout"),
        (moe_module, "grouped_expert_ffn", "experts"),
        (ops, "swiglu_expert", "experts"),
        (moe_module, "shared_expert", "experts"),
        (ops, "final_logits", "head"),
        (model_module, "sparse_mla_fwd_paged", "sparse attention"),
        (model_module, "indexer_scores", "scores"),
        (model_module, "topk_of_scores", "top-k"),
        (model_module, "candidate_blocks_of_scores", "top-k (candidate blocks)"),
        (model_module, "candidate_positions", "top-k"),
        (model, "_engram", "engram"),
        (model, "_engram_inject", "engram"),
        (model, "_compress", "compressor"),
        (model, "_compress_decode", "compressor"),  # the decode path's (bench_decode --profile)
        (model, "_indexer", "indexer"),
        (model, "_indexer_decode", "indexer"),
        (model, "_window", "window cache"),
        (model, "_write_window", "window cache"),
    ]


@contextlib.contextmanager
def stage_ranges(model: V41Model) -> Iterator[list[str]]:
    """Wrap the model's building blocks in record_function ranges named STAGE_RANGE + label; undone on exit.
    Yields the targets the model no longer has (their time then shows under the enclosing stage)."""
    patched, missing = [], []

    def ranged(fn, label):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with torch.profiler.record_function(STAGE_RANGE + label):
                return fn(*args, **kwargs)
        return wrapper

    try:
        for owner, attr, label in _stage_targets(model):
            if not hasattr(owner, attr):
                missing.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}")
                continue
            patched.append((owner, attr, vars(owner).get(attr)))
            setattr(owner, attr, ranged(getattr(owner, attr), label))
        yield missing
    finally:
        for owner, attr, old in reversed(patched):
            if old is None:  # was a method of the class: drop the instance attribute
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


def summary_group(path: str) -> str:
    """The headline stage of a range path ("indexer/top-k" -> "top-k", "moe/experts/linear" -> "moe experts")."""
    labels = path.split("/")
    if any(lab.startswith("top-k") for lab in labels):
        return "top-k"
    if labels[0] == "moe":
        return {"routing": "moe routing", "experts": "moe experts"}.get(
            labels[1] if len(labels) > 1 else "", "moe dispatch/combine")
    return labels[0]


def attribute_profile(events, cuda: bool) -> tuple[dict[tuple[str, str], float], dict]:
    """Charge device time to (layer sample name or OUTSIDE, stage path) from a torch.profiler event list.

    Attribution is by time on the host thread: a CUDA kernel belongs to the ranges open when its launch API call
    (cudaLaunchKernel, cuLaunchKernelEx, ...: the CPU event with the kernel's correlation id) started. The
    profiler's own op links are not used: record_function ranges carry kineto's user correlation, so a Triton
    kernel launched inside a range but outside any aten op would have no link. On CPU each op's self CPU time is
    charged by its start time instead. Returns ({(layer, path): us}, a summary: total us, unlinked us (kernels
    whose launch call was not recorded, charged to OUTSIDE / "unlinked"), the top kernels (CPU: ops) by time with
    their main stage path).
    """
    from torch.autograd import DeviceType

    ranges: list[tuple[float, float, str]] = []
    items: list[tuple[float, float, str]] = []  # (host time, us, kernel or op name)
    launch_start: dict[int, float] = {}
    for e in events:
        if e.device_type != DeviceType.CPU:
            continue
        if e.name.startswith((LAYER_RANGE, STAGE_RANGE)):
            ranges.append((e.time_range.start, e.time_range.end, e.name))
        if not cuda:
            items.append((e.time_range.start, e.self_cpu_time_total, e.name))
        elif e.name.startswith("cu"):  # CUDA runtime / driver API calls
            launch_start[e.id] = e.time_range.start
    unlinked: list[tuple[str, float]] = []
    if cuda:
        for e in events:
            if e.device_type == DeviceType.CUDA and not e.name.startswith((LAYER_RANGE, STAGE_RANGE)):
                if e.id in launch_start:
                    items.append((launch_start[e.id], e.time_range.elapsed_us(), e.name))
                else:
                    unlinked.append((e.name, e.time_range.elapsed_us()))
    charged: dict[tuple[str, str], float] = defaultdict(float)
    kernel_paths: dict[str, Counter] = defaultdict(Counter)
    for (layer, path), us, name in _ranges_at(ranges, items):
        charged[(layer, path)] += us
        kernel_paths[name][path] += us
    for name, us in unlinked:
        charged[(OUTSIDE, "unlinked")] += us
        kernel_paths[name]["unlinked"] += us
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for _, us, name in items:
        by_name[name][0] += us
        by_name[name][1] += 1
    for name, us in unlinked:
        by_name[name][0] += us
        by_name[name][1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
    summary = {
        "total_us": sum(v[0] for v in by_name.values()),
        "unlinked_kernel_us": sum(us for _, us in unlinked),
        "top": [{"name": n[:120], "us": us, "calls": c, "stage": kernel_paths[n].most_common(1)[0][0]}
                for n, (us, c) in top],
    }
    return dict(charged), summary


def host_by_stage(events) -> dict[tuple[str, str], dict[str, float]]:
    """Host side of the same trace: per (layer, stage path), the host time spent in that stage's ranges outside
    its nested stage ranges ("host_us"; a layer's time outside every stage range goes to path "other") and the
    kernel launch calls made there ("launches": CUDA runtime / driver calls named *Launch*). Where a stage's host
    time exceeds its kernels' time, the GPU can only keep up while earlier work is queued. The profiler's own
    overhead inflates host times: compare stages with each other, not with the timed steps."""
    from torch.autograd import DeviceType

    ranges: list[tuple[float, float, str]] = []
    launches: list[tuple[float, float, str]] = []
    for e in events:
        if e.device_type != DeviceType.CPU:
            continue
        if e.name.startswith((LAYER_RANGE, STAGE_RANGE)):
            ranges.append((e.time_range.start, e.time_range.end, e.name))
        elif e.name.startswith("cu") and "Launch" in e.name:
            launches.append((e.time_range.start, 0.0, e.name))
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"host_us": 0.0, "launches": 0})
    for key, _, _ in _ranges_at(ranges, launches):
        out[key]["launches"] += 1
    # inclusive host time per (layer, path) from the ranges' nesting (a parent sorts before a child that starts
    # with it: longer first); a path's exclusive time is that less its direct children's
    inclusive: dict[tuple[str, str], float] = defaultdict(float)
    stack: list[tuple[float, str, str]] = []  # (end, layer, path) of the open ranges
    for start, end, name in sorted(ranges, key=lambda r: (r[0], -r[1])):
        while stack and stack[-1][0] <= start:
            stack.pop()
        layer, path = (stack[-1][1], stack[-1][2]) if stack else (OUTSIDE, "")
        if name.startswith(LAYER_RANGE):
            layer, path = name[len(LAYER_RANGE):], ""
        else:
            path = f"{path}/{name[len(STAGE_RANGE):]}" if path else name[len(STAGE_RANGE):]
        inclusive[(layer, path)] += end - start
        stack.append((end, layer, path))
    for (layer, path), us in inclusive.items():
        children = sum(v for (lay, p), v in inclusive.items()
                       if lay == layer and p.count("/") == (path.count("/") + 1 if path else 0) and p != path
                       and (not path or p.startswith(path + "/")))
        out[(layer, path or "other")]["host_us"] += us - children
    return dict(out)


def _ranges_at(ranges: list[tuple[float, float, str]], items: list[tuple[float, float, str]]
               ) -> Iterator[tuple[tuple[str, str], float, str]]:
    """For each item (time, us, name): ((layer, stage path) of the ranges open at `time`, us, name). Ranges of
    one thread nest, so a sweep over the sorted start / item / end points keeps the open ones in a stack."""
    points = [(start, 0, i) for i, (start, _, _) in enumerate(ranges)]
    points += [(end, 2, i) for i, (_, end, _) in enumerate(ranges)]
    points += [(t, 1, j) for j, (t, _, _) in enumerate(items)]
    points.sort()  # at equal times: open, then item, then close
    open_ranges: list[int] = []
    for _, kind, i in points:
        if kind == 0:
            open_ranges.append(i)
        elif kind == 2:
            open_ranges.remove(i)
        else:
            names = [ranges[k][2] for k in open_ranges]
            layers = [n[len(LAYER_RANGE):] for n in names if n.startswith(LAYER_RANGE)]
            path = "/".join(n[len(STAGE_RANGE):] for n in names if n.startswith(STAGE_RANGE)) or "other"
            _, us, name = items[i]
            yield ((layers[0] if layers else OUTSIDE), path), us, name


def by_layer_and_path_ms(charged: dict[tuple[str, str], float]) -> dict[str, float]:
    """{"layer | stage path": ms}, largest first: the profile's finest breakdown (charged in us)."""
    return {f"{layer} | {path}": us / 1e3 for (layer, path), us in sorted(charged.items(), key=lambda kv: -kv[1])}


def stage_summary(charged: dict[tuple[str, str], float], counts: Counter, n_engram: int) -> dict:
    """Headline stages in ms: for the profiled step as run, and weighted to the 40-layer model (each mode's
    sample layer x its count; the Engram layer contributes only its Engram stage, x n_engram)."""
    as_run: dict[str, float] = defaultdict(float)
    forty: dict[str, float] = defaultdict(float)
    for (layer, path), us in charged.items():
        group, ms = summary_group(path), us / 1e3
        as_run[group] += ms
        if layer == OUTSIDE:
            forty[group] += ms
        elif layer == "window+engram":
            forty[group] += n_engram * ms if group == "engram" else 0.0
        else:
            forty[group] += counts.get(layer, 0) * ms
    order = sorted(as_run, key=lambda g: -forty.get(g, 0.0))
    return {"profiled_step_ms": {g: as_run[g] for g in order}, "forty_layer_ms": {g: forty[g] for g in order}}


def host_summary(host: dict[tuple[str, str], dict[str, float]]) -> dict:
    """host_by_stage per headline stage, for the profiled step as run: host ms and kernel launches."""
    ms: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for (_, path), v in host.items():
        group = summary_group(path)
        ms[group] += v["host_us"] / 1e3
        launches[group] += int(v["launches"])
    return {"host_ms": dict(ms), "launches": dict(launches)}
