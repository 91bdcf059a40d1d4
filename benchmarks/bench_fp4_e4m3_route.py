"""The grouped FP8 x FP4 GEMMs on their FP8-MMA route (`folded=`, gemm_gluon_fp4_e4m3_kernel.py) against the bf16
route (the package's default) in the same process, at bench_deepgemm's MoE shapes (docs/reports/deepgemm-fp8-moe.md).
The FP8-MMA route runs twice: on activations with UE8M0 scales per 32 ("fp8_route") and on the same activations
folded per 128 ("fp8_route_fold128": float32 scales, the kernels' SA_PER_128 loop, what the engine passes since
session 21; docs/reports/deepgemm-moe-fold-128.md).

- Prefill (contiguous): 96 experts of 128-1,024 rows, 96 of 192-320 (~256: EP4's prefill step, since session 38)
  and 384 of 32-96 (one GPU's prefill step), w13
  4,608 x 5,120 and w2 5,120 x 2,304: TFLOP/s over the real rows, the ratio to the bf16 route's whole call
  (activation pass + GEMM) and to `torch._scaled_grouped_mm` (FP8 rowwise; the issue's peer).
- Decode (masked): 96 experts of Poisson(8) and Poisson(32) rows: weight bytes per second as a fraction of the device
  copy (`bench_deepgemm.copy_bandwidth_gbs`, same process), and the ratio to the bf16 route.
Every route gets the same weights. Their scale bytes are drawn from 118-128 (a row spans at most 10; the route takes
11; bench_deepgemm draws 116-128). GPU time by CUDA-graph replay (`exp_gemm_gluon_v3.ms`). Every valid row is
compared (calc_diff): the FP8-MMA route against the bf16 route, the folded activations' rows against the per-32 ones
(the fold's rounding). Writes $OUT/bench_fp4_e4m3_route.json.

    cd benchmarks && timeout 300 python3 bench_fp4_e4m3_route.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import (FP4_SCALE_BOUND, contiguous_operands, copy_bandwidth_gbs, masked_operands,  # beside this
                            rand_fp4_weight_scales, rand_fp8)
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128
from mini_deepgemm.testing import calc_diff

MOE_SHAPES = (("w13", 4608, 5120), ("w2", 5120, 2304))


def scaled_grouped_mm_peer(a: torch.Tensor, ends: torch.Tensor, groups: int, N: int, K: int):
    """The issue's peer for the contiguous layout: torch._scaled_grouped_mm (FP8, rowwise scales) of the activations
    a (e4m3 [M, K], groups ending at `ends`) with random e4m3 weights [groups, N, K], as a call with its operands bound
    (they are freed with it)."""
    w8 = rand_fp8(groups, N, K)
    s_a, s_b = torch.rand(a.shape[0], device="cuda") + 0.5, torch.rand(groups, N, device="cuda") + 0.5
    return lambda: torch._scaled_grouped_mm(a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)


# (experts, rows per expert): bench_deepgemm's 96 of 128-1,024; EP4's prefill step, 96 local experts of ~256 rows
# (4 ranks x 4,096 tokens x 6 / 384); one GPU's prefill step: 384 of 32-96 (~64: 4,096 tokens x 6 / 384), where a
# 128-row tile is about half padding (the contiguous kernel skips an all-padding half since session 30)
PREFILL_LAYOUTS = ((96, (128, 1024)), (96, (192, 320)), (384, (32, 96)))


def prefill_rows(gen) -> list[dict]:
    rows_out = []
    for groups, rows_range in PREFILL_LAYOUTS:
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            bq_route, folded = G.fold_fp4_weights(bq, sb)
            d_bf16, d128, a128 = torch.empty_like(d), torch.empty_like(d), fold_ue8m0_to_128(a, sa, 1)
            calls = {
                "fp8_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    (a, sa), (bq_route, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded),
                "fp8_route_fold128": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    a128, (bq_route, sb), d128, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded),
                "bf16_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    (a, sa), (bq, sb), d_bf16, layout, weight_scale_max=FP4_SCALE_BOUND),
            }
            t = {k: ms(fn) for k, fn in calls.items()}
            t["scaled_grouped_mm_fp8"] = ms(scaled_grouped_mm_peer(a, ends, groups, N, K))
            used = layout >= 0
            flops = 2 * sum(rows) * N * K
            row = {"layout": "contiguous", "groups": groups, "name": name, "N": N, "K": K, "rows": sum(rows),
                   "weight_bytes": bq.numel() + sb.numel(),
                   "diff_routes": float(calc_diff(d[used].float(), d_bf16[used].float())),
                   "diff_fold128": float(calc_diff(d128[used].float(), d[used].float())),
                   **{f"us_{k}": v * 1e3 for k, v in t.items()},
                   **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()}}
            row["fp8_over_bf16_route"] = t["bf16_route"] / t["fp8_route"]
            row["fp8_over_scaled_grouped_mm"] = t["scaled_grouped_mm_fp8"] / t["fp8_route"]
            row["fold128_over_fp8_route"] = t["fp8_route"] / t["fp8_route_fold128"]
            row["fold128_over_scaled_grouped_mm"] = t["scaled_grouped_mm_fp8"] / t["fp8_route_fold128"]
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            torch.cuda.empty_cache()
    return rows_out


def decode_rows(gen, copy_gbs: float) -> list[dict]:
    rows_out = []
    for expected_m in (8, 32):
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            bq_route, folded = G.fold_fp4_weights(bq, sb)
            d_bf16, d128, a128 = torch.empty_like(d), torch.empty_like(d), fold_ue8m0_to_128(a, sa, 1)
            calls = {
                "fp8_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                    (a, sa), (bq_route, sb), d, masked_m, expected_m, weight_scale_max=FP4_SCALE_BOUND,
                    folded=folded),
                "fp8_route_fold128": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                    a128, (bq_route, sb), d128, masked_m, expected_m, weight_scale_max=FP4_SCALE_BOUND,
                    folded=folded),
                "bf16_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                    (a, sa), (bq, sb), d_bf16, masked_m, expected_m, weight_scale_max=FP4_SCALE_BOUND),
            }
            t = {k: ms(fn) for k, fn in calls.items()}
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            weight_bytes = bq.numel() + sb.numel()
            row = {"layout": "masked", "groups": 96, "expected_m": expected_m, "name": name, "N": N, "K": K,
                   "rows": int(masked.sum()), "copy_gbs": copy_gbs,
                   "diff_routes": float(calc_diff(d[used].float(), d_bf16[used].float())),
                   "diff_fold128": float(calc_diff(d128[used].float(), d[used].float())),
                   **{f"us_{k}": v * 1e3 for k, v in t.items()},
                   **{f"frac_of_copy_{k}": weight_bytes / v / 1e6 / copy_gbs for k, v in t.items()}}
            row["fp8_over_bf16_route"] = t["bf16_route"] / t["fp8_route"]
            row["fold128_over_fp8_route"] = t["fp8_route"] / t["fp8_route_fold128"]
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            torch.cuda.empty_cache()
    return rows_out


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": prefill_rows(gen)}
    copy_gbs = copy_bandwidth_gbs()
    torch.cuda.empty_cache()
    result["rows"] += decode_rows(gen, copy_gbs)
    with open(os.path.join(os.environ.get("OUT", "."), "bench_fp4_e4m3_route.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| layout | experts | GEMM | rows | FP8 route, folded per 128 | per 32 | bf16 route | x per 32 | peer "
          "| diff per 128 vs per 32 | FP8 vs bf16 route |")
    for r in result["rows"]:
        if r["layout"] == "contiguous":
            print(f"| contiguous | {r['groups']} | {r['name']} | {r['rows']} | "
                  f"{r['tflops_fp8_route_fold128']:.0f} TFLOP/s | {r['tflops_fp8_route']:.0f} | "
                  f"{r['tflops_bf16_route']:.0f} | {r['fold128_over_fp8_route']:.2f} | "
                  f"{r['fold128_over_scaled_grouped_mm']:.2f}x scaled_grouped_mm "
                  f"({r['tflops_scaled_grouped_mm_fp8']:.0f}) | {r['diff_fold128']:.1e} | {r['diff_routes']:.1e} |")
        else:
            print(f"| masked ~{r['expected_m']} | 96 | {r['name']} | {r['rows']} | "
                  f"{r['frac_of_copy_fp8_route_fold128']:.2f} of copy | {r['frac_of_copy_fp8_route']:.2f} | "
                  f"{r['frac_of_copy_bf16_route']:.2f} | {r['fold128_over_fp8_route']:.2f} | "
                  f"copy {r['copy_gbs']:.0f} GB/s | {r['diff_fold128']:.1e} | {r['diff_routes']:.1e} |")


if __name__ == "__main__":
    main()
