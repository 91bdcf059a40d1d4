"""Dense FP8 GEMMs of the V4.1 recipe at decode sizes (M <= 64 rows) on one GPU: the split-K kernel against the
64 x 32 tile kernel (both give a row the same bits; gemm._splitk_runs picks one per call: "routed"), cuBLAS
per-tensor FP8 at the same shape, and the device copy rate.

Usage (GPU machine): python3 benchmarks/bench_dense_decode.py [--out DIR] [--sweep]
Shapes: the V4.1-Flash weights that take the V4.1 route at decode in the engine (ops.dense_v3_form: fewer than 64
output tiles of 128 x 128): wq_a, wkv, wo_b, the indexer's wq_b, the shared expert's w13 and w2. Rows 1, 16, 32,
64. Timing as a decode step runs them: calls replayed from a CUDA graph (no host launch time; session 42 run 1 timed
them with do_bench and measured the host's launch path instead, 30-240 us a call), each call on its own copy of the
weight, enough copies for 256 MB, so that every call reads its weight from HBM, not from the 50 MB L2 (in a decode
step each weight is read once per layer); the time per call is the replay's over the copies, median of 5 replays.
Weight bytes per second are compared with a device copy (bench_deepgemm.copy_bandwidth_gbs) in the same run.
--sweep: at 64 rows, slice counts and ring depths around the routed ones (gemm._splitk_slices), the numbers the
defaults come from.
Writes DIR/dense_decode.json (every row, hardware, versions, date) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from bench_deepgemm import DENSE_SHAPES, Recorder, copy_bandwidth_gbs, rand_fp8, rand_ue8m0  # beside this script
from mini_deepgemm import gemm as G

DECODE_SHAPES = ["wq_a", "wkv", "wo_b", "idx_wq_b", "shared_w13", "shared_w2"]
ROWS = [1, 16, 32, 64]


class Operands:
    """Activations [M, K] with UE8M0 per 32, the output, and enough copies of a weight [N, K] (UE8M0 per 32 x 32) for
    256 MB."""

    def __init__(self, M: int, N: int, K: int) -> None:
        self.aq, self.sa = rand_fp8(M, K), rand_ue8m0(M, K // 32).view(torch.uint8)
        self.d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        self.weights = [(rand_fp8(N, K), rand_ue8m0(N // 32, K // 32).view(torch.uint8))
                        for _ in range(-(-256 * 2**20 // (N * K)))]


def graph_us(op: Operands, call) -> float:
    """us per call(aq, sa, bq, sb, d), replayed from one CUDA graph over every weight copy (module docstring)."""
    def all_copies():
        for bq, sb in op.weights:
            call(op.aq, op.sa, bq, sb, op.d)

    all_copies()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        all_copies()
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(op.weights))
    return statistics.median(times[1:])


def bench_shape(rec: Recorder, name: str, M: int, copy_gbs: float) -> None:
    N, K = DENSE_SHAPES[name]
    op = Operands(M, N, K)
    one = torch.ones((), device="cuda")
    e8 = torch.float8_e8m0fnu
    steps, splits = G._splitk_slices(N, K)
    us = {
        "routed": graph_us(op, lambda aq, sa, bq, sb, d: G.fp8_gemm_nt((aq, sa.view(e8)), (bq, sb.view(e8)), d)),
        "splitk": graph_us(op, lambda aq, sa, bq, sb, d: G._gluon_fp8_v41_splitk_gemm(aq, sa, bq, sb, d, steps,
                                                                                       splits)),
        "tiles_64x32": graph_us(op, lambda aq, sa, bq, sb, d: G._gluon_fp8_v41_gemm(aq, sa, bq, sb, d, 64, 32, 6, 0)),
        "cublas_fp8_tensor": graph_us(op, lambda aq, sa, bq, sb, d: torch._scaled_mm(aq, bq.t(), one, one,
                                                                                    out_dtype=torch.bfloat16)),
    }
    rec.add(kind="dense_decode", name=name, M=M, N=N, K=K, routed_splitk=G._splitk_runs(M, N, K), slice_steps=steps,
            splits=splits, copy_gbs=copy_gbs,
            copies=len(op.weights), **{f"us_{k}": v for k, v in us.items()},
            **{f"frac_of_copy_{k}": N * K / v / 1e3 / copy_gbs for k, v in us.items()})


def sweep_shape(rec: Recorder, name: str, copy_gbs: float) -> None:
    """At 64 rows: slice counts 1, 2, 4, ... up to one step per slice, at ring depths 3, 4 and 6."""
    N, K = DENSE_SHAPES[name]
    op = Operands(64, N, K)
    steps = K // 128
    for per_slice in sorted({-(-steps // s) for s in (1, 2, 4, 7, 10, 16, 20, 40)}, reverse=True):
        splits = -(-steps // per_slice)
        for stages in (3, 4, 6):
            us = graph_us(op, lambda aq, sa, bq, sb, d: G._gluon_fp8_v41_splitk_gemm(aq, sa, bq, sb, d, per_slice,
                                                                                      splits, stages))
            rec.add(kind="dense_decode_sweep", name=name, M=64, N=N, K=K, slice_steps=per_slice, splits=splits,
                    stages=stages, us=us, frac_of_copy=N * K / us / 1e3 / copy_gbs)


def table(rows: list[dict]) -> str:
    lines = ["| weight | N x K | M | slices | routed | routed us | split-K us | 64 x 32 us | cuBLAS per-tensor us | "
             "split-K / copy | 64 x 32 / copy | split-K vs 64 x 32 | routed vs cuBLAS |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["kind"] != "dense_decode":
            continue
        lines.append(f"| {r['name']} | {r['N']} x {r['K']} | {r['M']} | {r['splits']} x {r['slice_steps']} | "
                     f"{'split-K' if r['routed_splitk'] else '64 x 32'} | {r['us_routed']:.1f} | "
                     f"{r['us_splitk']:.1f} | {r['us_tiles_64x32']:.1f} | {r['us_cublas_fp8_tensor']:.1f} | "
                     f"{r['frac_of_copy_splitk']:.2f} | {r['frac_of_copy_tiles_64x32']:.2f} | "
                     f"{r['us_tiles_64x32'] / r['us_splitk']:.2f}x | "
                     f"{r['us_cublas_fp8_tensor'] / r['us_routed']:.2f}x |")
    sweep = [r for r in rows if r["kind"] == "dense_decode_sweep"]
    if sweep:
        lines += ["", "| weight (M = 64) | slices x steps | stages | us | of copy |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['name']} | {r['splits']} x {r['slice_steps']} | {r['stages']} | {r['us']:.1f} | "
                  f"{r['frac_of_copy']:.2f} |" for r in sweep]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--sweep", action="store_true", help="slice counts and ring depths at 64 rows")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args.out)
    rec.path = os.path.join(args.out, "dense_decode.json")  # Recorder rewrites it after every row
    copy_gbs = copy_bandwidth_gbs()
    rec.meta["copy_gbs"] = copy_gbs
    for name in DECODE_SHAPES:
        for M in ROWS:
            bench_shape(rec, name, M, copy_gbs)
    if args.sweep:
        for name in DECODE_SHAPES:
            sweep_shape(rec, name, copy_gbs)
    print(table(rec.rows))


if __name__ == "__main__":
    main()
