"""Experiment (issue 5): where the Gluon sparse-attention kernel's cycles go, from its own event trace.

The kernel's trace (sparse_attn_gluon_kernel._mark; `trace` of api._launch_gluon) records the SM's clock at each
step of every program: per pair of blocks, warpgroup 0's tile in, QK^T done, softmax done, PV done, block b
adopted, its PV done; warpgroup 1's block a adopted, tile b in, PV a + QK^T b done, softmax done, PV b done;
the producer's tile free and tile handed over per block; and the program's SM, first and last clock. Here, at
bench_flashmla's prefill shape (s_q 4,096, h 64, 128 window + 512 compressed slots, 131k context), bf16 rows and the
paged FP8/FP4 cache, and the paged cache's first 128 queries unsplit (decode at batch 128: one program per query,
fewer than the SMs):
- the traced call's outputs against the untraced call's (the trace must not change a bit) and both times;
- per step, the median cycles over the programs that did not start in the first wave (no cold start; decode: all),
  with the pair period and how soon after its hand-over each tile was taken;
- the programs' cycles from first to last clock, and the gap between one program's end and the next one's start
  on the same SM (a program holds its SM alone: 227 KB of shared memory);
- one program's events in order, as a timeline.
Writes $OUT/exp_flashmla_trace.json and prints the tables.

    cd benchmarks && python3 exp_flashmla_trace.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_flashmla import S_Q, SCALE, bench, bench_graph, environment, prefill_case
from mini_flashmla import api
from mini_flashmla import sparse_attn_gluon_kernel as kernel
from mini_flashmla.sparse_attn_kernel import FORMAT_BF16, FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW

HEADER, PAIR_EVENTS = kernel.HEADER.value, kernel.PAIR_EVENTS.value
TRACE_EVENTS, TRACE_ROLES = kernel.TRACE_EVENTS.value, kernel.TRACE_ROLES.value

# (name, role, event offset in a pair (consumers) or block (producer), offset of the event it is measured from)
WG0_STEPS = [("tile a in (wait)", 0, 0, -1), ("QK^T a", 0, 1, 0), ("softmax a", 0, 2, 1), ("publish + PV a", 0, 3, 2),
             ("adopt b (wait + rescale)", 0, 4, 3), ("PV b", 0, 5, 4)]
WG1_STEPS = [("adopt a (wait + rescale)", 1, 0, -1), ("tile b in (wait)", 1, 1, 0), ("PV a + QK^T b", 1, 2, 1),
             ("softmax b", 1, 3, 2), ("publish + PV b", 1, 4, 3)]
LAST = {0: 5, 1: 4}  # a consumer's last event in a pair: where the next pair's first step is measured from


DECODE_BATCH = 128


def traced_call(case: dict, kind: str, trace: torch.Tensor | None):
    if kind == "decode":  # the paged case's first DECODE_BATCH queries, unsplit
        case = {**case, **{k: case[k][:DECODE_BATCH] for k in ("q", "wid", "cid")}}
        kind = "paged"
    if kind == "bf16":
        sources = ((case["kv"], case["idx"], FORMAT_BF16.value), None)
    else:
        sources = ((case["window_cache"], case["wid"], FORMAT_FP8_WINDOW.value),
                   (case["compressed_cache"], case["cid"], FORMAT_FP4_COMPRESSED.value))
    return api._launch_gluon(case["q"], *sources, SCALE, case["sink"], 1, trace)


def step_cycles(trace: torch.Tensor, n_blocks: int, steady: torch.Tensor) -> dict:
    """Median cycles, over the steady programs, of each consumer step per pair, of the pair period and the cycles from
    each tile's hand-over to its consumer past its wait, of the producer's fill and wait per block, and of the prologue
    (first clock to warpgroup 0's first tile) and epilogue (last PV to last clock)."""
    t = trace[steady].double()
    start = t[:, HEADER, 1]
    rows = {}
    pairs = n_blocks // 2
    for steps in (WG0_STEPS, WG1_STEPS):
        for name, role, ev, since in steps:
            per_pair = []
            for pair in range(pairs):
                base = pair * PAIR_EVENTS
                if since >= 0:
                    origin = t[:, role, base + since]
                elif pair == 0:
                    origin = start
                else:
                    origin = t[:, role, base - PAIR_EVENTS + LAST[role]]
                per_pair.append(t[:, role, base + ev] - origin)
            rows[f"wg{role}: {name}"] = [float(x.median()) for x in per_pair]
    # How the loops line up: a tile taken a few hundred cycles or less after its hand-over had its consumer waiting
    # for the producer (sessions 67-68: both tiles of a pair, "just in time")
    rows["pair period (wg0's tile a in to the next)"] = [
        float((t[:, 0, p * PAIR_EVENTS] - t[:, 0, (p - 1) * PAIR_EVENTS]).median()) for p in range(1, pairs)]
    freed, handed = t[:, 2, 0::2], t[:, 2, 1::2]  # the producer's events per block: tile free, tile handed over
    rows["tile a: handed over -> wg0 has it"] = [float((t[:, 0, p * PAIR_EVENTS] - handed[:, 2 * p]).median())
                                                 for p in range(pairs)]
    rows["tile b: handed over -> wg1 has it"] = [float((t[:, 1, p * PAIR_EVENTS + 1] - handed[:, 2 * p + 1]).median())
                                                 for p in range(pairs)]
    fill = [handed[:, b] - freed[:, b] for b in range(n_blocks)]
    wait = [freed[:, b] - (handed[:, b - 1] if b else t[:, HEADER, 3]) for b in range(n_blocks)]
    rows["producer: fill (tile free -> handed over)"] = [float(x.median()) for x in fill]
    rows["producer: wait for a free tile"] = [float(x.median()) for x in wait]
    last_pv = t[:, 0, (pairs - 1) * PAIR_EVENTS + LAST[0]]
    rows["prologue: first clock -> wg0's first tile"] = [float((t[:, 0, 0] - start).median())]
    rows["epilogue: wg0's last PV -> last clock"] = [float((t[:, HEADER, 2] - last_pv).median())]
    rows["program: first -> last clock"] = [float((t[:, HEADER, 2] - start).median())]
    return rows


def sm_gaps(trace: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether each program started after another ended on its SM, the cycles from that end to its start)."""
    sm, start, end = trace[:, HEADER, 0], trace[:, HEADER, 1], trace[:, HEADER, 2]
    order = torch.argsort(sm * (1 << 44) + (start - start.min()))
    sm_o, start_o, end_o = sm[order], start[order], end[order]
    follows = torch.zeros_like(sm, dtype=torch.bool)
    gap = torch.zeros_like(start)
    same = sm_o[1:] == sm_o[:-1]
    follows[order[1:]] = same
    gap[order[1:]] = start_o[1:] - end_o[:-1]
    return follows, gap


def timeline(trace: torch.Tensor, program: int, n_blocks: int) -> list[str]:
    t = trace[program]
    start = int(t[HEADER, 1])
    events = [(int(t[HEADER, 3]), "producer", "start"), (int(t[HEADER, 4]), "producer", "end"),
              (int(t[HEADER, 2]), "wg0", "end")]
    for pair in range(n_blocks // 2):
        for steps in (WG0_STEPS, WG1_STEPS):
            for name, role, ev, _ in steps:
                events.append((int(t[role, pair * PAIR_EVENTS + ev]), f"wg{role}", f"pair {pair}: {name} done"))
    for b in range(n_blocks):
        events += [(int(t[2, 2 * b]), "producer", f"block {b}: tile free"),
                   (int(t[2, 2 * b + 1]), "producer", f"block {b}: handed over")]
    return [f"{c - start:8d}  {who:8s} {what}" for c, who, what in sorted(events)]


def main() -> None:
    dev = torch.device("cuda")
    result = environment(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    case = prefill_case(dev)
    n_blocks = case["idx"].shape[1] // 64
    assert n_blocks // 2 * PAIR_EVENTS <= TRACE_EVENTS and 2 * n_blocks <= TRACE_EVENTS
    for kind in ("bf16", "paged", "decode"):
        queries = DECODE_BATCH if kind == "decode" else S_Q
        programs = queries * case["q"].shape[1] // 64
        timer = bench_graph if kind == "decode" else bench  # decode: device time (its host time is longer)
        trace = torch.zeros(programs, TRACE_ROLES, TRACE_EVENTS, dtype=torch.int64, device=dev)
        out, lse = traced_call(case, kind, None)
        traced_out, traced_lse = traced_call(case, kind, trace)
        assert torch.equal(out, traced_out) and torch.equal(lse, traced_lse), "the trace changed the outputs"
        ms = timer(lambda: traced_call(case, kind, None))
        traced_ms = timer(lambda: traced_call(case, kind, trace))
        trace = trace.cpu()
        follows, gap = sm_gaps(trace)
        steady = follows & (gap >= 0)
        if not steady.any():  # one wave (decode): every program
            steady = torch.ones_like(follows)
        cycles = trace[:, HEADER, 2] - trace[:, HEADER, 1]
        busy = torch.zeros(sms, dtype=torch.float64).index_add_(0, trace[:, HEADER, 0], cycles.double())
        r = {"ms": ms, "traced_ms": traced_ms, "tflops": 2 * queries * 64 * n_blocks * 64 * 1024 / ms / 1e9,
             "programs": programs, "steady_programs": int(steady.sum()),
             "program_cycles_median": float(cycles[steady].double().median()),
             "gap_cycles_median": float(gap[steady].double().median()),
             "gap_cycles_mean": float(gap[steady].double().mean()),
             "busy_cycles_per_sm_mean": float(busy.mean()), "clock_mhz_at_least": float(busy.mean() / (ms * 1e3)),
             "steps": step_cycles(trace, n_blocks, steady),
             "timeline": timeline(trace, int(steady.nonzero()[len(steady.nonzero()) // 2]), n_blocks)}
        result[kind] = r
        print(f"== {kind}: {ms * 1e3:.1f} us untraced, {traced_ms * 1e3:.1f} us traced, {r['tflops']:.1f} TFLOP/s; "
              f"{r['steady_programs']} of {programs} programs after another on their SM")
        print(f"program {r['program_cycles_median']:.0f} cycles (median), gap to the previous program on the SM "
              f"{r['gap_cycles_median']:.0f} (median) / {r['gap_cycles_mean']:.0f} (mean); the programs' cycles per SM "
              f"over the kernel's time: {r['clock_mhz_at_least']:.0f} MHz (the clock is at least that)")
        for name, per in r["steps"].items():
            print(f"  {name:46s} " + " ".join(f"{x:7.0f}" for x in per))
        print("\n".join(r["timeline"]))
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_trace.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
