"""Experiment (issue 4, session 43): FP4 expert weights stored step-tiled, each K step of a 128-row tile one
contiguous 8 KB block ([G, N / 128, K / 128, 128, 64 bytes]), against the checkpoint's row-major [G, N, K / 2].

Why: a step of the FP8-MMA grouped kernels reads 64 bytes from each of 128 weight rows, 2,560 (w13) or 1,152 (w2)
bytes apart. Session 14 (exp_weight_stream.py) found that pattern slow as a bare read (0.2 of the device copy,
against 0.6 for 4 KB blocks) but worth only 1.05-1.09x to the masked kernel of the time, which reached 0.3-0.4 of
the copy; the masked decode tile now reaches ~0.7-0.78, closer to where the DRAM pattern could bind. The tiled form
changes only the TMA coordinates (the shared-memory tile is the same box), so every output must be bitwise equal.

Cases: the masked kernel at one GPU's decode (384 experts, Poisson(1) and Poisson(2) rows, at least one each), at
~8 and ~32 rows (96 experts), and the contiguous kernel at one GPU's prefill (384 experts of 32-96 rows) and the
issue's 96 experts of 128-1,024; w13 and w2; activations folded per 128, as the engine calls them. GPU time by
CUDA-graph replay; weight bytes per second against the device copy of the same process. Writes
$OUT/exp_moe_tiled_weights.json and prints a markdown table.

    cd benchmarks && python3 exp_moe_tiled_weights.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import contiguous_operands, copy_bandwidth_gbs, masked_operands, rand_fp4_weight_scales
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128

MASKED_CASES = ((384, 1), (384, 2), (96, 8), (96, 32))
CONTIGUOUS_CASES = ((384, (32, 96)), (96, (128, 1024)))


def tiled(bq: torch.Tensor) -> torch.Tensor:
    """[G, N, K / 2] packed FP4 -> the same bytes step-tiled, shaped [G, N, K / 2]."""
    groups, n, k2 = bq.shape
    return bq.view(groups, n // 128, 128, k2 // 64, 64).permute(0, 1, 3, 2, 4).contiguous().view(groups, n, k2)


def compare(row: dict, layout: int, a128, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor, group_arg, folded,
            expected_m: int | None, used: torch.Tensor, copy_gbs: float) -> None:
    """Times the layout's kernel on bq as it is and step-tiled into row; compares the used rows' bits."""
    outs = {}
    for key, w in (("natural", bq), ("tiled", tiled(bq))):
        outs[key] = torch.zeros_like(d)
        t = ms(lambda w=w, key=key: G._fp4_e4m3_gemm(layout, a128, (w, sb), outs[key], group_arg, folded, expected_m,
                                                     w_tiled=key == "tiled"))
        weight_bytes = bq.numel() + sb.numel()
        row[f"us_{key}"] = t * 1e3
        row[f"frac_of_copy_{key}"] = weight_bytes / t / 1e6 / copy_gbs
    row["tiled_over_natural"] = row["us_natural"] / row["us_tiled"]
    row["bitwise"] = bool(torch.equal(outs["natural"][used].view(torch.int16), outs["tiled"][used].view(torch.int16)))


def main() -> None:
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs, "rows": []}
    for groups, expected_m in MASKED_CASES:
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(groups, expected_m, N, K)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            row = {"layout": "masked", "groups": groups, "expected_m": expected_m, "name": name,
                   "rows": int(masked.sum()), "tile": G._masked_tile(expected_m)[0]}
            compare(row, G._MASKED, a128, bq, sb, d, masked_m, folded, expected_m, used, copy_gbs)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    gen = torch.Generator().manual_seed(43)
    for groups, rows_range in CONTIGUOUS_CASES:
        for name, N, K in MOE_SHAPES:
            rows, layout, _, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            row = {"layout": "contiguous", "groups": groups, "rows_range": list(rows_range), "name": name,
                   "rows": sum(rows)}
            compare(row, G._CONTIGUOUS, a128, bq, sb, d, layout, folded, None, layout >= 0, copy_gbs)
            row["tflops_natural"] = 2 * sum(rows) * N * K / row["us_natural"] / 1e6
            row["tflops_tiled"] = 2 * sum(rows) * N * K / row["us_tiled"] / 1e6
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_tiled_weights.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| layout | experts | rows per expert | GEMM | natural us (of copy) | tiled us (of copy) | tiled / natural "
          "| bitwise |")
    print("|---|---:|---|---|---:|---:|---:|---|")
    for r in result["rows"]:
        per = f"~{r['expected_m']}" if r["layout"] == "masked" else f"{r['rows_range'][0]}-{r['rows_range'][1]}"
        print(f"| {r['layout']} | {r['groups']} | {per} | {r['name']} | {r['us_natural']:.1f} "
              f"({r['frac_of_copy_natural']:.3f}) | {r['us_tiled']:.1f} ({r['frac_of_copy_tiled']:.3f}) | "
              f"{r['tiled_over_natural']:.3f}x | {r['bitwise']} |")


if __name__ == "__main__":
    main()
