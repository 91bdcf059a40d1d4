"""mini-deepep dispatch/combine on 2 GPUs against NCCL baselines, in one run.

    torchrun --nproc-per-node 2 benchmarks/bench_deepep.py [--tokens 4096 --hidden 5120 --topk 6 --experts 384]

Rows (per rank; times are the max over ranks of the per-rank median, CUDA events, after warm-up,
each iteration starting from a barrier):
  nvshmem  dispatch bf16 / fp8 (exact row count: one host read), dispatch bf16 with fixed rows
           (no host sync), combine bf16; the dispatch halves (notify; host read + data kernel); a
           sweep of the data kernels' program count, sender share and tile shapes
  (a) torch+NCCL: the same API on all_to_all_single (layout, permute, all_to_all, un-permute)
  (b) bare NCCL all_to_all_single of exactly the dispatched bytes
  (c) store-to-peer Triton copy of the bytes that cross NVLink (both GPUs writing): the ceiling
  (d) the seed's EP scheme: all_gather x, then reduce_scatter the [R*T, hidden] outputs
Rows ending in ", queued" time the GPU alone: the launches wait behind a GPU sleep (see `timed`); ", steady"
rows time 10 back-to-back calls (per call), so the ranks' start skew is paid once: the sweeps use them.
Phase times: one traced call of each data kernel (per program %globaltimer stamps; in the JSON meta).
Bandwidth: "recv GB/s" is DeepEP's metric (received tokens x hidden x 2 bytes / time, FP8 scaled by
(1 + 4/128) / 2 is not applied: we count the real FP8 bytes); "NVLink GB/s" counts only the bytes
that crossed NVLink (rows from/to the other rank). Results: a table on stdout and JSON under $OUT.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
import torch.distributed as dist
import triton

from mini_deepep import Buffer
from mini_deepep.kernels.peer_copy import peer_copy_kernel
from mini_deepep.layout import get_dispatch_layout_torch


def timed(fn, warmup: int, iters: int, queue_us: float = 0.0, calls: int = 1, samples: list | None = None) -> float:
    """Median seconds of fn() on this rank, max over ranks; every iteration starts from a barrier.

    queue_us > 0: a GPU sleep of that long is queued before the start event, so fn's launches are queued
    while it runs and the time is the GPU's alone (no CPU launch gaps), as when the host runs ahead.
    calls > 1: each iteration times that many back-to-back calls and reports the time per call, so the
    skew between the ranks' starts (one rank's kernel waiting for the other's) is paid once, not per call:
    the steady state of a model that dispatches layer after layer. samples: gets this rank's time of every iteration."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queue_us:
            torch.cuda._sleep(int(queue_us * 1.98e3))  # SM cycles at H200's ~1.98 GHz boost clock
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    if samples is not None:
        samples.extend(times)
    med = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med)


def timed_halves(first, second, warmup: int, iters: int) -> tuple[float, float]:
    """Like `timed` for second(first()), reporting the two halves separately."""
    for _ in range(warmup):
        second(first())
    halves = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        state = first()
        ev[1].record()
        second(state)
        ev[2].record()
        torch.cuda.synchronize()
        halves.append((ev[0].elapsed_time(ev[1]) / 1e3, ev[1].elapsed_time(ev[2]) / 1e3))
    med = torch.tensor([statistics.median(h[i] for h in halves) for i in range(2)], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med[0]), float(med[1])


def timed_after(prepare, fn, warmup: int, iters: int) -> float:
    """Like `timed` for fn(prepare()), timing only fn: prepare's work is done (synchronized) first."""
    for _ in range(warmup):
        fn(prepare())
    times = []
    for _ in range(iters):
        state = prepare()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(state)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    med = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med)


# "steady" rows: STEADY_CALLS back-to-back calls per timed window, queued behind a GPU sleep (see `timed`).
STEADY_CALLS, STEADY_QUEUE_US = 10, 3000


def phase_times(trace: torch.Tensor, senders: int) -> dict[str, dict[str, float]]:
    """Per role of a traced data kernel, us since its earliest program start: median and max of each phase's end."""
    rel = (trace.cpu() - trace[:, 0].min().cpu()).double() / 1e3
    summary = {}
    for role, rows in (("senders", rel[:senders]), ("receivers", rel[senders:])):
        summary[role] = {f"{stat} {phase}": float(getattr(rows[:, col], stat)()) for col, phase in
                         ((0, "start"), (1, "phase 1"), (2, "phase 2"), (3, "end")) for stat in ("median", "max")}
    return summary


def trace_window(backend, fn, calls: int, senders: int) -> list[dict[str, float]]:
    """Phase times of every call of one steady window (calls back to back, queued behind a GPU sleep), in us since
    the window's first program start on this rank: per call, its first start, the senders' wait for the previous
    call's CONSUMED (phase 1) and end, the receivers' phase 1 and end (median and max over programs)."""
    traces = []
    dist.barrier()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(STEADY_QUEUE_US * 1.98e3))
    for _ in range(calls):
        fn()
        traces.append(backend.last_trace)
    torch.cuda.synchronize()
    origin = min(int(t[:, 0].min()) for t in traces)
    rows = []
    for t in traces:
        rel = (t.cpu() - origin).double() / 1e3
        send, recv = rel[:senders], rel[senders:]
        rows.append({
            "start": float(rel[:, 0].min()), "end": float(rel[:, 3].max()),
            "send wait max": float((send[:, 1] - send[:, 0]).max()), "send end median": float(send[:, 3].median()),
            "send end max": float(send[:, 3].max()), "recv phase 1 median": float(recv[:, 1].median()),
            "recv phase 1 max": float(recv[:, 1].max()), "recv end median": float(recv[:, 3].median()),
            "recv end max": float(recv[:, 3].max()),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--num-sms", type=int, default=None, help="programs of the data kernels (default: every SM)")
    ap.add_argument("--dispatch-tile", type=int, default=None, help="rows per dispatch program step (default: the backend's)")
    ap.add_argument("--combine-tile", default=None, help="tokens x columns per combine program step, e.g. 4x1024")
    ap.add_argument("--sweep-sms", type=int, nargs="*", default=[32, 64, 132])
    ap.add_argument("--sweep-shares", type=float, nargs="*", default=[0.25, 0.5, 0.75])
    ap.add_argument("--sweep-warps", type=int, nargs="*", default=[8], help="warps per program of both data kernels")
    ap.add_argument("--sweep-dispatch-tiles", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--sweep-combine-tiles", nargs="*", default=["2x2048", "4x512", "2x1024"],
                    help="tokens x columns, optionally :programs per SM:warps (e.g. 8x256:4:4)")
    ap.add_argument("--sweep-two-pass", type=int, nargs="*", default=[0, 1, 2],
                    help="combine v7: tiles per reducer reduced in two passes (the default, None, is v6: every tile)")
    ap.add_argument("--long-steady", type=int, default=0,
                    help="also time the headline cases with this many back-to-back calls per window (0: skip)")
    ap.add_argument("--trace-steady", type=int, default=0,
                    help="only trace every call of a window of this many back-to-back calls of each data kernel "
                         "(per-call phase times per rank), then stop (0: the full benchmark)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    T, H, K, E = args.tokens, args.hidden, args.topk, args.experts

    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
    topk_idx = torch.rand(T, E, device="cuda", generator=gen).argsort(1)[:, :K].contiguous()
    topk_w = torch.rand(T, K, device="cuda", generator=gen)
    from mini_deepgemm.reference import act_quant

    x_fp8 = act_quant(x, 32)

    nv = Buffer(None, Buffer.get_nvl_buffer_size_hint(T, H, K, world), backend="nvshmem", num_sms=args.num_sms)
    if args.dispatch_tile:
        nv._backend.dispatch_tile = args.dispatch_tile
    if args.combine_tile:
        nv._backend.combine_tile, nv._backend.combine_cols = map(int, args.combine_tile.split("x"))
    tb = Buffer(None, backend="torch")
    layout = nv.get_dispatch_layout(topk_idx, E)

    # Correctness on this exact shape: NVSHMEM against the torch backend.
    res_nv = nv.dispatch(x, topk_idx, topk_w, E, layout=layout)
    res_tb = tb.dispatch(x, topk_idx, topk_w, E, layout=layout)
    valid = res_tb.grouped_layout >= 0
    same_layout = torch.equal(res_nv.grouped_layout, res_tb.grouped_layout)
    same_rows = same_layout and torch.equal(res_nv.recv_x[valid], res_tb.recv_x[valid])
    y = (res_tb.recv_x.float() * 1.5).to(torch.bfloat16)
    out_nv, out_tb = nv.combine(y, res_nv.handle), tb.combine(y, res_tb.handle)
    combine_max_diff = float((out_nv.float() - out_tb.float()).abs().max())
    combine_mismatch = float((out_nv != out_tb).float().mean())
    fp8_nv = nv.dispatch(x_fp8, topk_idx, topk_w, E, layout=layout)
    fp8_tb = tb.dispatch(x_fp8, topk_idx, topk_w, E, layout=layout)
    same_fp8 = all(
        torch.equal(a.view(torch.uint8)[valid], b.view(torch.uint8)[valid]) for a, b in zip(fp8_nv.recv_x, fp8_tb.recv_x)
    )
    assert not nv.timed_out()

    # Bytes: tokens received (each once per destination rank), and the part that crossed NVLink.
    send_counts = layout.num_tokens_per_rank.tolist()
    recv_counts = torch.bincount(res_tb.handle.recv_src_rank.long(), minlength=world).tolist()
    recv_tokens = sum(recv_counts)
    remote_tokens = recv_tokens - recv_counts[rank]
    bf16_row, fp8_row = 2 * H, H + H // 32
    rows = int(res_nv.handle.num_recv_rows)
    fixed_rows = rows + 4096  # a fixed, generous output size (the CUDA-graph path)

    results: dict[str, float] = {}
    W, I = args.warmup, args.iters
    if args.trace_steady:
        # Every call of a few steady windows traced, then the same windows untraced: per-window times, to see
        # whether tracing itself or the window-to-window spread separates them.
        backend = nv._backend
        cases = {
            "dispatch bf16, fixed rows": lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout,
                                                             num_max_recv_rows=fixed_rows),
            "combine bf16": lambda: nv.combine(y, res_nv.handle),
        }
        windows, periods, by_events = {}, {}, {}
        for name, fn in cases.items():
            senders = backend.data_grid(name.split()[0])[0]
            backend.trace = True
            for _ in range(W):
                trace_window(backend, fn, args.trace_steady, senders)
            traced_windows = [trace_window(backend, fn, args.trace_steady, senders) for _ in range(I)]
            per_rank = [None] * world
            dist.all_gather_object(per_rank, traced_windows)
            windows[name] = [rank_windows[I // 2] for rank_windows in per_rank]
            periods[name] = [[round(w[-1]["end"] / len(w), 1) for w in rank_windows] for rank_windows in per_rank]
            for trace in (True, False):  # the same windows timed by CUDA events, with the traced kernel and without
                backend.trace = trace
                samples: list[float] = []
                timed(fn, W, I, queue_us=STEADY_QUEUE_US, calls=args.trace_steady, samples=samples)
                per_rank = [None] * world
                dist.all_gather_object(per_rank, [round(t * 1e6, 1) for t in samples])
                by_events[f"{name}, {'traced' if trace else 'untraced'} kernel"] = per_rank
        if rank == 0:
            for name, per_rank in windows.items():
                for r, rows in enumerate(per_rank):
                    traced, untraced = by_events[f"{name}, traced kernel"][r], by_events[f"{name}, untraced kernel"][r]
                    print(f"--- {name}, rank {r}: us per call of the traced windows {periods[name][r]}; by events, "
                          f"traced kernel {traced}, untraced {untraced}")
                    print(f"    window {I // 2} (us since its first program start on this rank):")
                    print(" ".join(f"{k:>10s}" for k in ["call", *rows[0]]))
                    for i, row in enumerate(rows):
                        print(" ".join([f"{i:>10d}", *(f"{v:10.1f}" for v in row.values())]))
            if os.environ.get("OUT"):
                with open(os.path.join(os.environ["OUT"], "bench_deepep_trace_steady.json"), "w") as f:
                    json.dump({"gpu": torch.cuda.get_device_name(), "world": world, "tokens_per_rank": T, "hidden": H,
                               "topk": K, "experts": E, "calls": args.trace_steady, "traced_us_per_call": periods,
                               "event_timed_us_per_call": by_events, "middle_window": windows}, f, indent=1)
        nv.destroy()
        dist.destroy_process_group()
        return
    results["nvshmem dispatch bf16"] = timed(lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout), W, I)
    results["nvshmem dispatch bf16, fixed rows"] = timed(
        lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows), W, I
    )
    results["nvshmem dispatch fp8"] = timed(lambda: nv.dispatch(x_fp8, topk_idx, topk_w, E, layout=layout), W, I)
    results["nvshmem combine bf16"] = timed(lambda: nv.combine(y, res_nv.handle), W, I)
    backend = nv._backend
    notify_s, data_s = timed_halves(
        lambda: backend.dispatch_notify([x], topk_idx, topk_w, layout, E, 128),
        lambda notified: backend.dispatch_data(notified, None), W, I,
    )
    results["nvshmem dispatch bf16: notify kernel"] = notify_s
    results["nvshmem dispatch bf16: host read + data kernel"] = data_s
    results["nvshmem dispatch bf16, fixed rows: data kernel alone"] = timed_after(
        lambda: backend.dispatch_notify([x], topk_idx, topk_w, layout, E, 128),
        lambda notified: backend.dispatch_data(notified, fixed_rows), W, I,
    )
    # Program count and sender share of the data kernels (the defaults are one of these points).
    default_sms, default_shares = backend.num_sms, (backend.dispatch_sender_share, backend.combine_sender_share)
    default_warps = (backend.dispatch_warps, backend.combine_warps)
    for warps in args.sweep_warps:
        backend.dispatch_warps = backend.combine_warps = warps
        for num_sms in args.sweep_sms:
            for share in args.sweep_shares:
                nv.set_num_sms(num_sms)
                backend.dispatch_sender_share = backend.combine_sender_share = share
                config = f"{num_sms} SMs, {share:.2f} send" + ("" if warps == 8 else f", {warps} warps")
                results[f"nvshmem dispatch bf16, fixed rows, {config}, steady"] = timed(
                    lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows), W, I,
                    queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS,
                )
                results[f"nvshmem combine bf16, {config}, steady"] = timed(
                    lambda: nv.combine(y, res_nv.handle), W, I, queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS,
                )
    nv.set_num_sms(default_sms)
    backend.dispatch_sender_share, backend.combine_sender_share = default_shares
    backend.dispatch_warps, backend.combine_warps = default_warps
    default_tiles = (backend.dispatch_tile, backend.combine_tile, backend.combine_cols)
    for tile in args.sweep_dispatch_tiles:
        backend.dispatch_tile = tile
        results[f"nvshmem dispatch bf16, fixed rows, {tile}-row tiles, steady"] = timed(
            lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows), W, I,
            queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS,
        )
    default_programs = backend.combine_programs_per_sm
    for config in args.sweep_combine_tiles:
        tile_cols, *grid = config.split(":")
        backend.combine_tile, backend.combine_cols = map(int, tile_cols.split("x"))
        if grid:
            backend.combine_programs_per_sm, backend.combine_warps = map(int, grid)
        label = tile_cols + (f" tiles, {grid[0]} programs per SM, {grid[1]} warps" if grid else " tiles")
        results[f"nvshmem combine bf16, {label}, steady"] = timed(
            lambda: nv.combine(y, res_nv.handle), W, I, queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS
        )
        backend.combine_programs_per_sm, backend.combine_warps = default_programs, default_warps[1]
    backend.dispatch_tile, backend.combine_tile, backend.combine_cols = default_tiles
    default_two_pass = backend.combine_two_pass_tiles
    for two_pass in args.sweep_two_pass:
        backend.combine_two_pass_tiles = two_pass
        results[f"nvshmem combine bf16, {two_pass} two-pass tiles per reducer, steady"] = timed(
            lambda: nv.combine(y, res_nv.handle), W, I, queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS
        )
    backend.combine_two_pass_tiles = default_two_pass
    # The notify inside the dispatch data kernel (opt-in, fixed row counts only): same outputs as the two kernels.
    fixed = nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows)
    backend.fuse_notify = True
    fused = nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows)
    used = fixed.grouped_layout >= 0  # padding rows are never written
    same_fused = (torch.equal(fused.grouped_layout, fixed.grouped_layout) and torch.equal(fused.handle.positions,
                  fixed.handle.positions) and torch.equal(fused.recv_x[used], fixed.recv_x[used]))
    results["nvshmem dispatch bf16, fixed rows, fused notify, steady"] = timed(
        lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows), W, I,
        queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS,
    )
    backend.fuse_notify = False
    # Where the time goes inside the data kernels: per-program phase times (%globaltimer) of one traced call each.
    backend.trace = True
    traced = {}
    for name, fn in (
        ("dispatch bf16, fixed rows", lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows)),
        ("combine bf16", lambda: nv.combine(y, res_nv.handle)),
    ):
        for _ in range(3):  # the last of a few calls, each from a barrier
            dist.barrier()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
        per_rank = [None] * world
        dist.all_gather_object(per_rank, phase_times(backend.last_trace, backend.data_grid(name.split()[0])[0]))
        traced[name] = per_rank
    backend.trace = False
    results["layout, torch ops (get_dispatch_layout_torch)"] = timed(
        lambda: get_dispatch_layout_torch(topk_idx, E, world), W, I
    )
    results["layout (get_dispatch_layout, Triton on CUDA)"] = timed(lambda: nv.get_dispatch_layout(topk_idx, E), W, I)
    results["(a) torch+NCCL dispatch bf16"] = timed(lambda: tb.dispatch(x, topk_idx, topk_w, E, layout=layout), W, I)
    results["(a) torch+NCCL dispatch fp8"] = timed(lambda: tb.dispatch(x_fp8, topk_idx, topk_w, E, layout=layout), W, I)
    results["(a) torch+NCCL combine bf16"] = timed(lambda: tb.combine(y, res_tb.handle), W, I)

    bytes_of = {
        "nvshmem dispatch bf16": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "nvshmem dispatch bf16, fixed rows": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "nvshmem dispatch fp8": (recv_tokens * fp8_row, remote_tokens * fp8_row),
        "nvshmem combine bf16": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "(a) torch+NCCL dispatch bf16": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "(a) torch+NCCL dispatch fp8": (recv_tokens * fp8_row, remote_tokens * fp8_row),
        "(a) torch+NCCL combine bf16": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "(b) NCCL all_to_all_single, dispatched bf16 bytes": (recv_tokens * bf16_row, remote_tokens * bf16_row),
        "(d) all_gather x (EP baseline dispatch)": (world * T * bf16_row, (world - 1) * T * bf16_row),
        "(d) reduce_scatter y (EP baseline combine)": (world * T * bf16_row, (world - 1) * T * bf16_row),
    }
    send_bytes = torch.empty(sum(send_counts) * bf16_row, dtype=torch.uint8, device="cuda")
    recv_bytes = torch.empty(recv_tokens * bf16_row, dtype=torch.uint8, device="cuda")
    in_split, out_split = [c * bf16_row for c in send_counts], [c * bf16_row for c in recv_counts]
    results["(b) NCCL all_to_all_single, dispatched bf16 bytes"] = timed(
        lambda: dist.all_to_all_single(recv_bytes, send_bytes, out_split, in_split), W, I
    )

    peer = (rank + 1) % world
    remote_words = send_counts[peer] * bf16_row // 4
    src_words = torch.randint(0, 1 << 30, (remote_words,), dtype=torch.int32, device="cuda")
    # The ceiling: the best of a few launch shapes of a plain copy (both GPUs writing at once).
    for programs, block, warps in ((132, 4096, 8), (528, 2048, 8), (1056, 1024, 4)):
        results[f"(c) store-to-peer copy, {programs}x{block} words"] = timed(
            lambda: peer_copy_kernel[(programs,)](
                src_words, backend.buf32, backend.peer_offsets, peer, backend.layout.dispatch_offset, remote_words,
                BLOCK=block, num_warps=warps,
            ), W, I
        )
        bytes_of[f"(c) store-to-peer copy, {programs}x{block} words"] = (remote_words * 4, remote_words * 4)
    gathered = torch.empty(world * T, H, dtype=torch.bfloat16, device="cuda")
    scattered = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
    results["(d) all_gather x (EP baseline dispatch)"] = timed(lambda: dist.all_gather_into_tensor(gathered, x), W, I)
    results["(d) reduce_scatter y (EP baseline combine)"] = timed(
        lambda: dist.reduce_scatter_tensor(scattered, gathered), W, I
    )

    # The headline rows again with launches queued behind a GPU sleep: GPU time without CPU launch gaps.
    queued = {
        "nvshmem dispatch bf16, fixed rows": lambda: nv.dispatch(x, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows),
        "nvshmem dispatch fp8, fixed rows": lambda: nv.dispatch(x_fp8, topk_idx, topk_w, E, layout=layout, num_max_recv_rows=fixed_rows),
        "nvshmem combine bf16": lambda: nv.combine(y, res_nv.handle),
        "layout (get_dispatch_layout, Triton on CUDA)": lambda: nv.get_dispatch_layout(topk_idx, E),
        "(b) NCCL all_to_all_single, dispatched bf16 bytes": lambda: dist.all_to_all_single(recv_bytes, send_bytes, out_split, in_split),
        "(d) all_gather x (EP baseline dispatch)": lambda: dist.all_gather_into_tensor(gathered, x),
    }
    queued["(c) store-to-peer copy, 132x4096 words"] = lambda: peer_copy_kernel[(132,)](
        src_words, backend.buf32, backend.peer_offsets, peer, backend.layout.dispatch_offset, remote_words,
        BLOCK=4096, num_warps=8,
    )
    for name, fn in queued.items():
        nbytes = bytes_of.get(name, bytes_of["nvshmem dispatch fp8"] if "fp8" in name else (0, 0))
        results[f"{name}, queued"] = timed(fn, W, I, queue_us=400)
        results[f"{name}, steady"] = timed(fn, W, I, queue_us=STEADY_QUEUE_US, calls=STEADY_CALLS)
        bytes_of[f"{name}, queued"] = bytes_of[f"{name}, steady"] = nbytes

    if args.long_steady:
        # The ranks' start skew is paid once per window, so longer windows spread it over more calls (session 7:
        # 50-call windows read the same as 10-call ones, so the skew is not what separates steady from traced).
        for name in ("nvshmem dispatch bf16, fixed rows", "nvshmem combine bf16",
                     "(b) NCCL all_to_all_single, dispatched bf16 bytes", "(c) store-to-peer copy, 132x4096 words"):
            key = f"{name}, steady x{args.long_steady}"
            results[key] = timed(queued[name], W, I, queue_us=max(STEADY_QUEUE_US, 200 * args.long_steady),
                                 calls=args.long_steady)
            bytes_of[key] = bytes_of[f"{name}, steady"]
    for name in list(results):
        if " SMs, " in name or "alone" in name or " tiles" in name or "combine bf16, steady" in name or "fused" in name:
            bytes_of[name] = bytes_of["nvshmem combine bf16"]
    if rank == 0:
        table = []
        for name, sec in results.items():
            total, nvlink = bytes_of.get(name, (0, 0))
            table.append({"case": name, "us": sec * 1e6, "recv_GBps": total / sec / 1e9, "nvlink_GBps": nvlink / sec / 1e9})
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
            "triton": triton.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "tokens_per_rank": T, "hidden": H, "topk": K, "experts": E, "num_sms_default": default_sms,
            "sender_shares_default": default_shares, "tiles_default (dispatch, combine, combine cols)": default_tiles,
            "combine_two_pass_tiles_default": default_two_pass,
            "warps_default (dispatch, combine)": default_warps,
            "warmup": W, "iters": I, "recv_tokens_rank0": recv_tokens, "remote_tokens_rank0": remote_tokens,
            "recv_rows_rank0": rows,
            "check": {"same_layout": same_layout, "same_bf16_rows": same_rows, "same_fp8_rows": same_fp8,
                      "same_with_fused_notify": same_fused,
                      "combine_max_abs_diff_vs_torch": combine_max_diff, "combine_mismatch_fraction": combine_mismatch},
        }
        meta["phase_times_us"] = traced
        print(json.dumps(meta, indent=1))
        print(f"{'case':52s} {'us':>9s} {'recv GB/s':>10s} {'NVLink GB/s':>12s}")
        for row in table:
            print(f"{row['case']:52s} {row['us']:9.1f} {row['recv_GBps']:10.1f} {row['nvlink_GBps']:12.1f}")
        out_dir = os.environ.get("OUT")
        if out_dir:
            with open(os.path.join(out_dir, "bench_deepep.json"), "w") as f:
                json.dump({"meta": meta, "results": table}, f, indent=1)
    nv.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
