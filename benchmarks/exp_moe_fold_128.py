"""Experiment (issue 4), prepared in session 20 and not yet run on a GPU: the FP8-MMA MoE route with its activations
folded per 128 (reference.fold_ue8m0_to_128, as `per_token_group_quant_fp8(..., fold_128=True)` makes them), so
the math loop runs one m64n128k128 MMA and one FMA per element per K step instead of four m64n*k32 MMAs and four
FMAs (gemm_gluon_fp4_e4m3_kernel's SA_PER_128).

Why (docs/reports/deepgemm-v41-fold.md, "What would move it next"): the route's contiguous kernel is issue-bound
in its math warps. Compiled offline (triton 3.6, sm_90a, ptxas), SASS instructions per warp and K step:

| kernel | per 32 (shipped) | per 128 |
|---|---:|---:|
| contiguous, math warp | 367 (8 bytes spilled per tile) | 118 (no spill) |
| masked, 16-token tiles | 430 (97 registers) | 285 (98) |
| masked, 32-token tiles | 572 (175 registers) | 325 (128) |

The default (SA_PER_128 False) compiles to the shipped PTX (checked, debug lines aside).

Measured here, both against the shipped route (per-32 activations, `folded=`) in the same process, GPU time by
CUDA-graph replay: prefill (contiguous, 96 experts of 128-1,024 rows, w13 / w2) as TFLOP/s, decode (masked,
Poisson(8) and Poisson(32) rows per expert) as a fraction of the device copy. The per-128 output is compared with
the shipped one on every used row (calc_diff: the fold's rounding plus bf16's). A child process runs one ragged
call of each kernel first (a hang ends the experiment). Writes $OUT/exp_moe_fold_128.json.

    cd benchmarks && timeout 300 python3 exp_moe_fold_128.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import (FP4_SCALE_BOUND, contiguous_operands, copy_bandwidth_gbs, masked_operands,  # beside this
                            rand_fp4_weight_scales)
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128
from mini_deepgemm.testing import calc_diff

MOE_SHAPES = (("w13", 4608, 5120), ("w2", 5120, 2304))
SMOKE_S = 150


def per_128(a: torch.Tensor, sa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-32 activations [..., K] in their per-128 form (the fold's reference; on the GPU's tensors)."""
    K = a.shape[-1]
    q, s = fold_ue8m0_to_128(a.reshape(-1, K), sa.reshape(-1, K // 32), 1)
    return q.reshape(a.shape), s.reshape(*a.shape[:-1], K // 128).contiguous()


def contiguous_case(gen, groups: int, N: int, K: int) -> dict:
    rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen)
    sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
    folded = G.fold_fp4_weight_scales(sb)
    a128, d128 = per_128(a, sa), torch.empty_like(d)
    return dict(rows=rows, layout=layout, used=layout >= 0, d=d, d128=d128, calls={
        "per_32": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sa), (bq, sb), d, layout,
                                                                 weight_scale_max=FP4_SCALE_BOUND, folded=folded),
        "per_128": lambda: G._fp4_e4m3_gemm(G._CONTIGUOUS, a128, (bq, sb), d128, layout, folded, None,
                                            sa_per_128=True)})


def masked_case(gen, expected_m: int, N: int, K: int) -> dict:
    masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K, gen)
    sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
    folded = G.fold_fp4_weight_scales(sb)
    a128, d128 = per_128(a, sa), torch.empty_like(d)
    used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
    return dict(masked=masked, used=used, d=d, d128=d128, weight_bytes=bq.numel() + sb.numel(), calls={
        "per_32": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (bq, sb), d, masked_m, expected_m,
                                                             weight_scale_max=FP4_SCALE_BOUND, folded=folded),
        "per_128": lambda: G._fp4_e4m3_gemm(G._MASKED, a128, (bq, sb), d128, masked_m, folded, expected_m,
                                            sa_per_128=True)})


def smoke(result) -> None:
    """Child process: one small call per kernel and tile; the per-128 rows against the per-32 ones."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for case in (contiguous_case(gen, 4, 256, 640), masked_case(gen, 8, 256, 640), masked_case(gen, 32, 256, 640)):
        for call in case["calls"].values():
            call()
        torch.cuda.synchronize()
        out.append(float(calc_diff(case["d128"][case["used"]].float(), case["d"][case["used"]].float())))
    result.put(out)


def main() -> None:
    diffs = smoke_in_child(smoke, SMOKE_S, "the per-128 kernels' smoke calls")
    print("smoke, calc_diff per-128 vs per-32 (contiguous, masked 16, masked 32):", diffs, flush=True)
    if not all(x < 1e-4 for x in diffs):
        raise SystemExit("the per-128 rows are far from the per-32 ones: not timed")
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    for name, N, K in MOE_SHAPES:
        case = contiguous_case(gen, 96, N, K)
        t = {k: ms(fn) for k, fn in case["calls"].items()}
        flops = 2 * sum(case["rows"]) * N * K
        row = {"layout": "contiguous", "name": name, "rows": sum(case["rows"]),
               "diff": float(calc_diff(case["d128"][case["used"]].float(), case["d"][case["used"]].float())),
               **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()}, "speedup": t["per_32"] / t["per_128"]}
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        del case
        torch.cuda.empty_cache()
    copy_gbs = copy_bandwidth_gbs()
    for expected_m in (8, 32):
        for name, N, K in MOE_SHAPES:
            case = masked_case(gen, expected_m, N, K)
            t = {k: ms(fn) for k, fn in case["calls"].items()}
            row = {"layout": f"masked ~{expected_m}", "name": name, "rows": int(case["masked"].sum()),
                   "diff": float(calc_diff(case["d128"][case["used"]].float(), case["d"][case["used"]].float())),
                   **{f"frac_of_copy_{k}": case["weight_bytes"] / v / 1e6 / copy_gbs for k, v in t.items()},
                   "speedup": t["per_32"] / t["per_128"], "copy_gbs": copy_gbs}
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            del case
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_fold_128.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| layout | GEMM | rows | per 32 | per 128 | speedup | calc_diff |")
    for r in result["rows"]:
        unit = ("tflops_", " TFLOP/s") if r["layout"] == "contiguous" else ("frac_of_copy_", " of copy")
        print(f"| {r['layout']} | {r['name']} | {r['rows']} | {r[unit[0] + 'per_32']:.2f}{unit[1]} | "
              f"{r[unit[0] + 'per_128']:.2f} | {r['speedup']:.2f}x | {r['diff']:.1e} |")


if __name__ == "__main__":
    main()
