"""Experiment (issue 4, session 21): the FP8-MMA masked MoE kernel's token tile, re-swept on activations folded per 128.

Why: session 19 picked 16-token tiles up to ~16 rows per expert and 32 above on per-32 activations, where the 32-
and 64-token tiles needed 175 and 255 registers (2 CTAs per SM). Folded activations (SA_PER_128, one FMA per element
per K step instead of four) took the 32-token tile to 128 registers offline, so the 64-token tile, which converts each
weight tile once for up to 64 tokens, may now pay at ~32-64 rows per expert (the ~32-row case is at 0.34-0.39 of the
copy rate against the issue's 0.6).

Measured: 96 experts, Poisson(8 / 32 / 64) rows (at most 128), w13 and w2, the public masked GEMM with folded weights
and folded activations, each token tile forced through gemm._masked_token_tile; weight bytes per second as a fraction
of the device copy (same process), GPU time by CUDA-graph replay. Every tile's used rows are compared bitwise with the
16-token tile's (each output element is the same sequence of MMAs and FMAs). Writes $OUT/exp_moe_masked_tiles.json.

    cd benchmarks && python3 exp_moe_masked_tiles.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import FP4_SCALE_BOUND, copy_bandwidth_gbs, masked_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128

TILES = (16, 32, 64)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs, "rows": []}
    routed = G._masked_token_tile
    for expected_m in (8, 32, 64):
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K, gen)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            row = {"expected_m": expected_m, "name": name, "rows": int(masked.sum()), "routed": routed(expected_m)}
            first = None
            for tile in TILES:
                G._masked_token_tile = lambda _expected_m, tile=tile: tile
                out = torch.empty_like(d)
                t = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a128, (bq, sb), out, masked_m, expected_m,
                                                                   weight_scale_max=FP4_SCALE_BOUND, folded=folded))
                row[f"frac_of_copy_{tile}"] = (bq.numel() + sb.numel()) / t / 1e6 / copy_gbs
                row[f"us_{tile}"] = t * 1e3
                if first is None:
                    first = out[used].view(torch.int16)
                row[f"bitwise_as_16_{tile}"] = bool(torch.equal(out[used].view(torch.int16), first))
            G._masked_token_tile = routed
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_masked_tiles.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"| rows per expert | GEMM | {' | '.join(f'{t} tokens' for t in TILES)} | routed | bitwise |")
    for r in result["rows"]:
        fracs = " | ".join(f"{r[f'frac_of_copy_{t}']:.3f}" for t in TILES)
        print(f"| ~{r['expected_m']} | {r['name']} | {fracs} | {r['routed']} | "
              f"{all(r[f'bitwise_as_16_{t}'] for t in TILES)} |")


if __name__ == "__main__":
    main()
