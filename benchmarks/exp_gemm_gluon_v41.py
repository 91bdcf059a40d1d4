"""Experiment (issue 4): the V4.1 recipe (UE8M0 scales per 1 x 32 and 32 x 32) on FP8 MMAs promoted every 32 of K
(gemm_gluon_fp8_kernel.fp8_gemm_v41_kernel: the V3 kernel's TMA producer warp, math warpgroups issuing one
m64n32k32 MMA per 32-column block so each partial tile has one scale per row) against the shipped route (the
swap-AB kernel on bf16 MMAs, gemm.default_config) and cuBLAS per-tensor FP8, same run.

It first runs small calls with a hard time limit in a child process (a producer/consumer mistake hangs rather than
fails): every variant against the reference (calc_diff) and against each other (bitwise: the kernel claims a row's
result does not depend on the tile shape). Then, per dense shape of bench_deepgemm.py at M = 4,096 (and the --m
list): calc_diff of the Gluon output against the shipped route's, both timed (CUDA-graph replay), and cuBLAS
per-tensor FP8. Then decode-sized M (1, 16, 64) at three shapes: the 64 x 32 tile against the shipped route.
Writes $OUT/exp_gemm_gluon_v41.json and prints tables.

    cd benchmarks && timeout 200 python3 exp_gemm_gluon_v41.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
import triton

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm import reference
from mini_deepgemm.testing import calc_diff

# (BLOCK_M, BLOCK_N, ring stages, persistent programs per SM; 0 = one program per tile)
VARIANTS = [(128, 128, 4, 1), (64, 128, 4, 2), (128, 128, 3, 1)]
DECODE_VARIANT = (64, 32, 6, 0)
DECODE_SHAPES = ("wq_a", "shared_w13", "wo_b")
SMOKE_S = 90


def run(op, d, variant) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, *variant)


def shipped(op, d) -> None:
    G.fp8_gemm_nt(*[(q, s) for q, s in op["v41"]], d)


def smoke(result) -> None:
    """Child process: per variant, a 256 x 288 x 640 call (N not a multiple of 128, five K steps: more than a lap of
    the ring) and a 100-row one; calc_diff against the reference, bitwise against the first variant."""
    out = []
    for M, N, K in ((256, 288, 640), (100, 160, 512)):
        op = dense_operands(M, N, K)
        (aq, sa), (bq, sb) = op["v41"]
        want = reference.gemm_nt_ref(aq, sa, bq, sb, 32, 32).float()
        first = None
        for variant in VARIANTS + [DECODE_VARIANT]:
            d = torch.full_like(op["d"], float("nan"))
            run(op, d, variant)
            torch.cuda.synchronize()
            first = d.clone() if first is None else first
            same = bool(torch.equal(d.view(torch.int16), first.view(torch.int16)))
            out.append((M, N, K, variant, calc_diff(d, want), same))
    result.put(out)


def smoke_or_exit() -> None:
    for row in smoke_in_child(smoke, SMOKE_S, "the Gluon V4.1 kernel's smoke calls"):
        print("smoke M N K", row[:3], "variant", row[3], "diff vs reference %.2e" % row[4], "bitwise vs first:", row[5],
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    smoke_or_exit()
    rows, one = [], torch.ones((), device="cuda")
    for M in args.m:
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            d, want = op["d"], torch.empty_like(op["d"])
            shipped(op, want)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K)
            first = None
            for v in VARIANTS:
                run(op, d, v)
                key = "gluon_%d_%d_s%d_p%d" % v
                row[f"{key}_diff_vs_shipped"] = calc_diff(d, want)
                first = d.clone() if first is None else first
                row[f"{key}_bitwise_vs_first"] = bool(torch.equal(d.view(torch.int16), first.view(torch.int16)))
                row[f"{key}_tflops"] = tflop / ms(lambda: run(op, d, v)) * 1e3
            row["shipped_tflops"] = tflop / ms(lambda: shipped(op, d)) * 1e3
            row["cublas_fp8_tensor_tflops"] = tflop / ms(
                lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            rows.append(row)
            print(name, M, {k: round(v, 1) if isinstance(v, float) and "tflops" in k else v for k, v in row.items()},
                  flush=True)
            del op, d, want, first
            torch.cuda.empty_cache()
    decode = []
    for name in DECODE_SHAPES:
        N, K = DENSE_SHAPES[name]
        for M in (1, 16, 64):
            op = dense_operands(M, N, K)
            d, want = op["d"], torch.empty_like(op["d"])
            shipped(op, want)
            run(op, d, DECODE_VARIANT)
            row = dict(name=name, M=M, N=N, K=K, diff_vs_shipped=calc_diff(d, want),
                       gluon_us=ms(lambda: run(op, d, DECODE_VARIANT)) * 1e3, shipped_us=ms(lambda: shipped(op, d)) * 1e3)
            row["weight_gb_per_s_gluon"] = N * K / row["gluon_us"] / 1e3
            decode.append(row)
            print("decode", row, flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100", variants=VARIANTS,
                decode_variant=DECODE_VARIANT)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v41.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, decode=decode), f, indent=1)
    keys = ["gluon_%d_%d_s%d_p%d" % v for v in VARIANTS]
    print("| shape | M | " + " | ".join(keys) + " | shipped (bf16 MMAs) | cuBLAS FP8 tensor | best/tensor | best/shipped |")
    for r in rows:
        best = max(r[f"{k}_tflops"] for k in keys)
        print(f"| {r['name']} | {r['M']} | " + " | ".join(f"{r[f'{k}_tflops']:.0f}" for k in keys)
              + f" | {r['shipped_tflops']:.0f} | {r['cublas_fp8_tensor_tflops']:.0f}"
              + f" | {best / r['cublas_fp8_tensor_tflops']:.2f} | {best / r['shipped_tflops']:.2f} |")
    print("| decode shape | M | Gluon 64x32 us | shipped us | Gluon weight GB/s |")
    for r in decode:
        print(f"| {r['name']} | {r['M']} | {r['gluon_us']:.1f} | {r['shipped_us']:.1f} | {r['weight_gb_per_s_gluon']:.0f} |")


if __name__ == "__main__":
    main()
