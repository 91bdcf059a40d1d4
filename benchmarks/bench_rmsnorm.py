"""The fused RMSNorm kernel (runtime/src/mini_deepinfer/layers/rmsnorm.py) against ops.rmsnorm (torch), one run.

Shapes: the V4.1 norms (D = 5,120 block norms, 1,280 q, 512 kv / compressor, 128 index keys) at 4,096 rows
(a prefill step) and 64 rows (a decode batch), bf16 in and out. Per op: the median ms (triton.testing.do_bench,
5 ms warm-up, 25 ms of repetitions, L2 cleared before each call), GB/s over the bytes it must move (one read of x,
one write of y, the weight), the same bytes moved by a torch device copy in the same run (bench_hc.copy_ms) and
the fused kernel's max abs error against torch. Writes JSON to --out (default $OUT/bench_rmsnorm.json or
./bench_rmsnorm.json) and prints a table.

    python3 benchmarks/bench_rmsnorm.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from bench_hc import copy_ms, environment, median_ms, rate, write_and_print_table  # beside this file
from mini_deepinfer.layers import rmsnorm as rmsf
from mini_deepinfer.models.deepseek_v41 import ops

EPS = 1e-20  # V41Config.rms_norm_eps
SHAPES = [(4096, 5120), (4096, 1280), (4096, 512), (4096, 128), (64, 5120), (64, 1280), (64, 512)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_rmsnorm.json"))
    args = parser.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for T, D in SHAPES:
        x = torch.randn(T, D, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.rand(D, generator=g, device="cuda") + 0.5).to(torch.bfloat16)
        n_bytes = 2 * T * D * 2 + D * 2
        err = (rmsf.rmsnorm_fused(x, w, EPS).float() - ops.rmsnorm(x, w, EPS).float()).abs().max().item()
        torch_ms = median_ms(lambda: ops.rmsnorm(x, w, EPS), "cuda")
        fused_ms = median_ms(lambda: rmsf.rmsnorm_fused(x, w, EPS), "cuda")
        copy = copy_ms(n_bytes, "cuda")
        rows.append({"T": T, "D": D, "bytes": n_bytes, "torch_ms": torch_ms, "fused_ms": fused_ms, "copy_ms": copy,
                     "fused_gbs": rate(fused_ms, n_bytes), "copy_gbs": rate(copy, n_bytes),
                     "fused_of_copy": copy / fused_ms, "speedup": torch_ms / fused_ms, "max_abs_error": err})
    result = {"environment": environment("cuda"), "dtype": "bfloat16", "eps": EPS,
              "timing": "triton.testing.do_bench median, warm-up 5 ms, repetitions 25 ms", "rows": rows}
    write_and_print_table("bench_rmsnorm", result, args.out, [
        ("rows", "r"), ("D", "r"), ("torch ms", "r"), ("fused ms", "r"), ("x torch", "r"), ("fused GB/s", "r"),
        ("of copy", "r"), ("max abs err", "r")], lambda r: [
        str(r["T"]), str(r["D"]), f"{r['torch_ms']:.4f}", f"{r['fused_ms']:.4f}", f"{r['speedup']:.2f}",
        f"{r['fused_gbs']:.0f}", f"{r['fused_of_copy']:.2f}", f"{r['max_abs_error']:.1e}"])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
