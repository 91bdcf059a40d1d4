"""Benchmark (issue 4): V4.1 FP8 GEMMs as shipped (per-32 scales, the V4.1 kernels) against the same operands folded
into the V3 recipe's form (per-128 power-of-two scales, the V3 kernels; docs/reports/deepgemm-v41-fold.md).

Why: the V4.1 kernel promotes its FP8 MMA accumulator every 32 of K (an FMA per element and a wait per MMA) and runs
0.54x cuBLAS per-tensor FP8; the V3 kernel promotes every 128 and runs 0.87x. Folding the four 32-blocks of every
128 under their largest scale keeps each value exactly unless it drops below e4m3's normal range (reference
.fold_ue8m0_to_128): calc_diff ~1e-12 from the V4.1 product on CPU, 1e6 times below the bf16 output's rounding.

Per M x bench_deepgemm dense shape (bf16 activations from testing.random_bf16, 32-blocks spread over 2^-4..2^4;
runs 2 and 4 drew the same distribution on the GPU before the session-20 review; e4m3 weights with UE8M0 32 x 32
scales, the weights folded once outside the timing): GPU time by CUDA-graph replay of
- the GEMMs alone: `fp8_gemm_nt` on the V4.1 operands and on the folded ones, cuBLAS per-tensor FP8 as the peer;
- the quantizers: `per_token_group_quant_fp8(x, 32)` and with fold_128 (the runtime quantizes before every GEMM);
- quantizer + GEMM, as the runtime's linear runs them;
and the folded output against the V4.1 one (calc_diff; both bf16). Writes $OUT/bench_v41_fold.json.

    cd benchmarks && timeout 300 python3 bench_v41_fold.py [--rows 64,4096]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from bench_deepgemm import DENSE_SHAPES, rand_fp8, rand_ue8m0  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import fold_fp8_weight_scales, fp8_gemm_nt, per_token_group_quant_fp8
from mini_deepgemm.testing import calc_diff, random_bf16

MS = (64, 256, 1024, 4096, 16384)


def shape_row(M: int, name: str, N: int, K: int) -> dict:
    x = random_bf16(M, K, device="cuda")
    b41 = (rand_fp8(N, K), rand_ue8m0(N // 32, K // 32))
    b3 = fold_fp8_weight_scales(*b41)
    a41 = per_token_group_quant_fp8(x, 32, "ue8m0")
    a3 = per_token_group_quant_fp8(x, 32, "ue8m0", fold_128=True)
    d41, d3 = (torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    fp8_gemm_nt(a41, b41, d41)
    fp8_gemm_nt(a3, b3, d3)
    one = torch.ones((), device="cuda")
    tflop = 2 * M * N * K / 1e12
    times = {
        "gemm_v41": ms(lambda: fp8_gemm_nt(a41, b41, d41)),
        "gemm_fold": ms(lambda: fp8_gemm_nt(a3, b3, d3)),
        "cublas_fp8_tensor": ms(lambda: torch._scaled_mm(a41[0], b41[0].t(), one, one, out_dtype=torch.bfloat16)),
        "quant_v41": ms(lambda: per_token_group_quant_fp8(x, 32, "ue8m0")),
        "quant_fold": ms(lambda: per_token_group_quant_fp8(x, 32, "ue8m0", fold_128=True)),
        "linear_v41": ms(lambda: fp8_gemm_nt(per_token_group_quant_fp8(x, 32, "ue8m0"), b41, d41)),
        "linear_fold": ms(lambda: fp8_gemm_nt(per_token_group_quant_fp8(x, 32, "ue8m0", fold_128=True), b3, d3)),
    }
    row = dict(name=name, M=M, N=N, K=K, calc_diff_fold_vs_v41=calc_diff(d3.float(), d41.float()),
               us={k: v * 1e3 for k, v in times.items()},
               tflops={k: tflop / times[k] * 1e3 for k in ("gemm_v41", "gemm_fold", "cublas_fp8_tensor")})
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=lambda v: tuple(int(t) for t in v.split(",")), default=MS,
                        help="row counts M (comma list)")
    Ms = parser.parse_args().rows
    result = environment(torch.device("cuda"))
    result["rows"] = []
    for M in Ms:
        for name, (N, K) in DENSE_SHAPES.items():
            result["rows"].append(shape_row(M, name, N, K))
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "bench_v41_fold.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | V4.1 TFLOP/s | fold TFLOP/s | fold / V4.1 | V4.1 / cuBLAS | fold / cuBLAS "
          "| quant us V4.1 / fold | linear speedup | calc_diff |")
    for r in result["rows"]:
        t, us = r["tflops"], r["us"]
        print(f"| {r['name']} | {r['M']} | {t['gemm_v41']:.0f} | {t['gemm_fold']:.0f} | "
              f"{t['gemm_fold'] / t['gemm_v41']:.2f} | {t['gemm_v41'] / t['cublas_fp8_tensor']:.2f} | "
              f"{t['gemm_fold'] / t['cublas_fp8_tensor']:.2f} | {us['quant_v41']:.1f} / {us['quant_fold']:.1f} | "
              f"{us['linear_v41'] / us['linear_fold']:.2f}x | {r['calc_diff_fold_vs_v41']:.1e} |")
    for M in Ms:
        rows = [r for r in result["rows"] if r["M"] == M]
        print(f"M = {M}: geomean vs cuBLAS per-tensor: V4.1 {geomean_vs_cublas(rows, 'gemm_v41'):.3f}, fold "
              f"{geomean_vs_cublas(rows, 'gemm_fold'):.3f}")


def geomean_vs_cublas(rows: list[dict], key: str) -> float:
    return torch.tensor([r["tflops"][key] / r["tflops"]["cublas_fp8_tensor"] for r in rows]).log().mean().exp().item()


if __name__ == "__main__":
    main()
