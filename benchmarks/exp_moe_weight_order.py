"""Experiment (issue 4, session 45): the FP8-MMA MoE route with its expert weights held in the kernels' order
(reference.fp4_to_fp8_mma_order: a thread's A-fragment bytes of a K step contiguous, the sign bits where the e4m3
bytes want them), against the checkpoint's order, as an A/B of two trees in two processes: this script on each
(`PYTHONPATH` = the side's src folders, e.g. gpu_session.sh's `side_path`).

Why (docs/reports/deepgemm-moe-fold-128.md, sessions 25, 32 and 44): the masked kernel's 8-token tile issued ~330
SASS instructions per thread and K step, ~45 of them 16-bit loads and their packing (a thread's two 2-byte pieces of
each k32 chunk lie 8 bytes apart in the checkpoint's order) and ~160 the conversion, 7 of whose 10 per word place
the sign bits. Offline (triton 3.6, sm_90a) the reordered weights take the K loop from 379 to 300 instructions at 8
tokens, 451 -> 376 at 16, 594 -> 517 at 32: 4 ldmatrix.x4 per step instead of 32 LDS.U16, 2 PRMT fewer per word
(run 1's order, word 4q + c, loaded the same words by 4 LDS.128 and spilled the contiguous kernel's converter).

What: the public grouped GEMMs on folded weights and activations folded per 128 (the engine's route), timed by
CUDA-graph replay:
- masked at the engine's decode loads (capacity one row per token of the batch): 384 experts of ~1 / 2 / 4 rows,
  96 of ~8, ~32 and ~64 (weight bytes per second as a fraction of the device copy, same process);
- contiguous at bench_fp4_e4m3_route's prefill layouts (TFLOP/s, and torch._scaled_grouped_mm in the same process).
Both sides draw the same operands (seeded), so each row's `checksum` (the int16 words of the used output rows, summed
as int64) must agree between the sides: the kernels compute the same MMAs on the same e4m3 bytes.
Writes $OUT/exp_moe_weight_order.json.

    cd benchmarks && python3 exp_moe_weight_order.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import (FP4_SCALE_BOUND, contiguous_operands, copy_bandwidth_gbs, masked_operands,  # beside this
                            rand_fp4_weight_scales)
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, PREFILL_LAYOUTS, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128

MASKED_CASES = ((384, 1, 64), (384, 2, 128), (384, 4, 256), (96, 8, 128), (96, 32, 128), (96, 64, 128))


def route_operands(bq: torch.Tensor, sb: torch.Tensor):
    """(the weights as this side's route reads them, the folded scales): fold_fp4_weights on the tree; the base
    (before session 45) folds the scales alone and reads the checkpoint's order."""
    if hasattr(G, "fold_fp4_weights"):
        return G.fold_fp4_weights(bq, sb)
    return bq, G.fold_fp4_weight_scales(sb)


def checksum(out: torch.Tensor) -> int:
    return int(out.view(torch.int16).to(torch.int64).sum())


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs,
              "order": "fp8_mma" if hasattr(G, "fold_fp4_weights") else "checkpoint", "rows": []}
    for groups, expected_m, max_m in MASKED_CASES:
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(groups, expected_m, N, K, max_m)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            (bq_route, folded), a128 = route_operands(bq, sb), fold_ue8m0_to_128(a, sa, 1)
            t = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a128, (bq_route, sb), d, masked_m, expected_m,
                                                               weight_scale_max=FP4_SCALE_BOUND, folded=folded))
            used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
            row = {"layout": "masked", "experts": groups, "expected_m": expected_m, "max_m": max_m, "name": name,
                   "rows": int(masked.sum()), "us": t * 1e3,
                   "frac_of_copy": (bq.numel() + sb.numel()) / t / 1e6 / copy_gbs, "checksum": checksum(d[used])}
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    for groups, rows_range in PREFILL_LAYOUTS:
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            (bq_route, folded), a128 = route_operands(bq, sb), fold_ue8m0_to_128(a, sa, 1)
            t = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a128, (bq_route, sb), d, layout,
                                                                   weight_scale_max=FP4_SCALE_BOUND, folded=folded))
            peer = ms(scaled_grouped_mm_peer(a, ends, groups, N, K))
            flops = 2 * sum(rows) * N * K
            row = {"layout": "contiguous", "experts": groups, "rows_range": list(rows_range), "name": name,
                   "rows": sum(rows), "us": t * 1e3, "tflops": flops / t / 1e9,
                   "tflops_scaled_grouped_mm": flops / peer / 1e9, "over_scaled_grouped_mm": peer / t,
                   "checksum": checksum(d[layout >= 0])}
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_weight_order.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"| order: {result['order']} | copy {copy_gbs:.0f} GB/s |")
    for r in result["rows"]:
        what = (f"masked {r['experts']} x ~{r['expected_m']} (cap {r['max_m']})" if r["layout"] == "masked"
                else f"contiguous {r['experts']} x {r['rows_range']}")
        figure = (f"{r['frac_of_copy']:.3f} of copy" if r["layout"] == "masked"
                  else f"{r['tflops']:.0f} TFLOP/s = {r['over_scaled_grouped_mm']:.3f}x peer")
        print(f"| {what} | {r['name']} | {r['us']:.1f} us | {figure} | {r['checksum']} |")


if __name__ == "__main__":
    main()
