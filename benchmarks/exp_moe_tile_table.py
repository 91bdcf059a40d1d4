"""Experiment (session 39): the contiguous FP8 x FP4 kernel's 128- and 256-row tiles forced in turn at
bench_fp4_e4m3_route's prefill layouts, on whichever tree is first on PYTHONPATH (the A/B's sides: the 256-row tiles
at multiples of 256 with a K sweep per expert, session 38, or cut from each expert's first row by the device-built
table, session 39). Activations folded per 128 (the engine's form). Per layout and GEMM: TFLOP/s over the real rows
of each tile size and of torch._scaled_grouped_mm (the issue's peer), and whether the two sizes' outputs are bitwise
equal. Writes $OUT/exp_moe_tile_table.json.

    cd benchmarks && python3 exp_moe_tile_table.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, PREFILL_LAYOUTS, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    chosen = G._contiguous_block_m
    rows_out = []
    # and 96 experts of 96-288 rows (~255 per expert with padding) and 192 of 64-192 (EP2's prefill step: 2 ranks x
    # 4,096 tokens x 6 / 384 = ~128 rows, ~192 with padding), below the route's 256
    for groups, rows_range in (*PREFILL_LAYOUTS, (96, (96, 288)), (192, (64, 192))):
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            folded = G.fold_fp4_weight_scales(sb)
            a128 = fold_ue8m0_to_128(a, sa, 1)
            flops = 2 * sum(rows) * N * K
            row = {"groups": groups, "name": name, "N": N, "K": K, "rows": sum(rows), "M": layout.numel(),
                   "routed_block_m": chosen(layout.numel(), groups, True)}
            out = {}
            for block_m in (128, 256):
                G._contiguous_block_m = lambda M, g, folded_128, b=block_m: b
                out[block_m] = torch.full_like(d, 7.0)
                call = lambda o=out[block_m]: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    a128, (bq, sb), o, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded)
                call()
                t = ms(call)
                row[f"us_{block_m}"], row[f"tflops_{block_m}"] = t * 1e3, flops / t / 1e9
            G._contiguous_block_m = chosen
            t_peer = ms(scaled_grouped_mm_peer(a, ends, groups, N, K))
            row["tflops_scaled_grouped_mm"] = flops / t_peer / 1e9
            row["bitwise_256_128"] = bool(torch.equal(out[256].view(torch.int16), out[128].view(torch.int16)))
            row["ratio_256_over_128"] = row["us_128"] / row["us_256"]
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_tile_table.json"), "w") as f:
        json.dump({"environment": environment(torch.device("cuda")), "rows": rows_out}, f, indent=1)
    print("| experts | rows | GEMM | 128-row tiles | 256-row tiles | 256 / 128 | peer | best / peer | bitwise |")
    for r in rows_out:
        best = max(r["tflops_128"], r["tflops_256"])
        print(f"| {r['groups']} | {r['rows']} | {r['name']} | {r['tflops_128']:.0f} | {r['tflops_256']:.0f} | "
              f"{r['ratio_256_over_128']:.3f} | {r['tflops_scaled_grouped_mm']:.0f} | "
              f"{best / r['tflops_scaled_grouped_mm']:.3f} | {r['bitwise_256_128']} |")


if __name__ == "__main__":
    main()
