"""mini-deepgemm's FP4 round trip (`per_token_group_fakequant_fp4`, one Triton kernel) against its reference
(reference.fp4_fakequant, ~30 torch ops), one run, at the indexer's shapes: queries [T, 32 heads, 128] at 4,096 rows
(a prefill step) and 64 (a decode batch), and 2,048 index keys [2,048, 128] (a ratio-2 layer's new keys per 4,096
tokens), all with UE8M0 scales per 32; the compressed KV's, e4m3 scales per 16, at [2,048, 512]; and the FP8 round
trip of the window KV (`per_token_group_fakequant_fp8` against reference.fp8_fakequant, UE8M0 per 32) at
[4,096, 512]. bf16. Per shape: median ms (triton.testing.do_bench: 5 ms warm-up, 25 ms of
repetitions), GB/s over one bf16 read and one bf16 write, the same bytes by a device copy in the same run
(bench_hc.copy_ms), and whether the kernel's bits equal the reference's. Writes --out (default
$OUT/bench_fp4_quant.json or ./bench_fp4_quant.json).

    python3 benchmarks/bench_fp4_quant.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from bench_hc import copy_ms, environment, median_ms, rate, write_and_print_table  # beside this file
from mini_deepgemm import per_token_group_fakequant_fp4, per_token_group_fakequant_fp8, reference

FP4 = (per_token_group_fakequant_fp4, reference.fp4_fakequant)
FP4_E4M3 = (lambda x: per_token_group_fakequant_fp4(x, 16, "e4m3"), lambda x: reference.fp4_fakequant(x, 16, "e4m3"))
FP8 = (per_token_group_fakequant_fp8, reference.fp8_fakequant)
# name: (shape, (kernel, reference))
SHAPES = {"queries, prefill": ((4096, 32, 128), FP4), "queries, decode": ((64, 32, 128), FP4),
          "index keys": ((2048, 128), FP4), "compressed kv (e4m3 per 16)": ((2048, 512), FP4_E4M3),
          "window kv (FP8), prefill": ((4096, 512), FP8)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_fp4_quant.json"))
    out_path = parser.parse_args(argv).out
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (shape, (kernel, ref)) in SHAPES.items():
        x = (torch.randn(*shape, generator=g, device="cuda") * 3).to(torch.bfloat16)
        n_bytes = 2 * x.numel() * 2
        exact = torch.equal(kernel(x).view(torch.int16), ref(x).view(torch.int16))
        reference_ms = median_ms(lambda: ref(x), "cuda")
        kernel_ms = median_ms(lambda: kernel(x), "cuda")
        copy = copy_ms(n_bytes, "cuda")
        rows.append({"name": name, "shape": list(shape), "bytes": n_bytes, "reference_ms": reference_ms,
                     "kernel_ms": kernel_ms, "copy_ms": copy, "kernel_gbs": rate(kernel_ms, n_bytes),
                     "kernel_of_copy": copy / kernel_ms, "speedup": reference_ms / kernel_ms, "bit_exact": exact})
    result = {"environment": environment("cuda"), "dtype": "bfloat16", "scales": "UE8M0 per 32",
              "timing": "triton.testing.do_bench median, warm-up 5 ms, repetitions 25 ms", "rows": rows}
    write_and_print_table("bench_fp4_quant", result, out_path, [
        ("tensor", "l"), ("shape", "l"), ("reference ms", "r"), ("kernel ms", "r"), ("x reference", "r"),
        ("kernel GB/s", "r"), ("of copy", "r"), ("bit-exact", "l")], lambda r: [
        r["name"], str(r["shape"]), f"{r['reference_ms']:.4f}", f"{r['kernel_ms']:.4f}", f"{r['speedup']:.2f}",
        f"{r['kernel_gbs']:.0f}", f"{r['kernel_of_copy']:.2f}", str(r["bit_exact"])])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
