"""Experiment (issue 4, session 54): the contiguous layout (MoE prefill) on the swap-AB kernel at few rows per expert.

Why: one GPU's prefill step gives each of the 384 experts ~64 rows (4,096 tokens x 6 / 384). The contiguous kernel's
128-row tiles are then about half padding, and the stage ran at 0.42 of its weight-bytes floor (0.38 of the copy
rate on w13, 0.29 of the FP8 MMA rate: neither unit busy; docs/reports/step-floors.md), while the masked kernel,
which streams weights with tokens as the MMA's N (8-64 per tile), reached 0.44-0.47 of the copy rate at ~64 rows
(H100, session 53). gemm.CONTIGUOUS_SWAPAB_MAX_ROWS routes a contiguous call to that kernel (its CONTIGUOUS form:
each 128-row block of the layout as a masked group of its real rows), with the token tile _masked_tile picks for the
call's rows per expert. H100, session 54 runs 2 and 5: 1.27-1.30x the contiguous kernel at ~16 rows, 1.10-1.15x at
~32, 0.85-0.91x at ~64 and below from there; so routed up to 32 rows. Run 5 also timed the contiguous kernel on
64 x 256 tiles (each math warpgroup 128 of the columns, where a 128-row tile of at most 64 rows leaves the second
idle): 0.71-0.78x at ~16-96 rows (at ~128-256 the variant was the 256-row tiles again: 0.98-0.99x, the run's repeat
noise); reverted (`git show bceb995:benchmarks/exp_moe_contiguous_swapab.py` has the variant).

Measured: each of CASES (experts, mean rows per expert: Poisson rows, experts of 0 rows without a segment; the
segments alone, 128-aligned, expected_m stated as the engine does), w13 and w2, the public contiguous GEMM with
folded weights and activations folded per 128 on each of VARIANTS; TFLOP/s over the real rows, weight bytes (of the
experts with rows) per second as a fraction of the device copy (same process), the ratio to
torch._scaled_grouped_mm (FP8 rowwise, the issue's peer) and to the contiguous kernel. GPU time by CUDA-graph
replay. Every variant's used rows are compared bitwise with the contiguous kernel's. Writes
$OUT/exp_moe_contiguous_swapab.json.

    cd benchmarks && python3 exp_moe_contiguous_swapab.py [--cases 384x64 ...] [--variants contiguous_kernel ...]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from bench_deepgemm import FP4_SCALE_BOUND, copy_bandwidth_gbs, rand_fp4_weight_scales, rand_fp8, rand_ue8m0
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128
from mini_deepgemm.testing import contiguous_layout

# name: (CONTIGUOUS_SWAPAB_MAX_ROWS, forced swap-AB tile or None for _masked_tile's)
VARIANTS = {"contiguous_kernel": (0, None),
            "swapab": (2**31, None),
            "swapab_64": (2**31, G.MaskedTile(64, 2, None, False)),
            "swapab_32_split": (2**31, G.MaskedTile(32, 2, 128, False, True))}
# (experts, mean rows per expert): one GPU's prefill at 1,024 / 2,048 / 3,072 / 4,096 / 6,144 tokens (384 experts),
# EP2's at 4,096 (192 local experts of ~128) and EP4's (96 of ~256). ~48 (where the route's threshold of 32 was not
# measured) was added after session 54's runs; session 55 run 3 (H100): swap-AB 1.055x / 0.996x (w13 / w2), session
# 56 run 1 (H200): 1.054x / 1.021x, so the threshold moved to 48.
CASES = ((384, 16), (384, 32), (384, 48), (384, 64), (384, 96), (192, 128), (96, 256))


def layout_rows(groups: int, mean: int) -> list[int]:
    """Poisson(mean) rows per expert from a generator seeded by the case alone (w13 and w2 time the same layout)."""
    gen = torch.Generator().manual_seed(7_000 * groups + mean)
    return torch.poisson(torch.full((groups,), float(mean)), generator=gen).int().tolist()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="*", default=[f"{g}x{m}" for g, m in CASES],
                   help="EXPERTSxROWS, e.g. 384x64 (default: CASES)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args()
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases]
    variants = {k: VARIANTS[k] for k in args.variants}
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs, "rows": []}
    routed_max_rows, routed_tile = G.CONTIGUOUS_SWAPAB_MAX_ROWS, G._masked_tile
    for groups, mean in cases:
        rows = layout_rows(groups, mean)
        layout = contiguous_layout(rows, 128).cuda()
        M = layout.numel()
        ends = torch.tensor([-(-m // 128) * 128 for m in rows]).cumsum(0).to(torch.int32).cuda()
        a128 = fold_ue8m0_to_128(rand_fp8(M, 5120), rand_ue8m0(M, 5120 // 32), 1)
        touched = sum(m > 0 for m in rows)
        for name, N, K in MOE_SHAPES:
            x = (a128[0][:, :K].contiguous(), a128[1][:, :K // 128].contiguous())
            bq = torch.randint(0, 256, (groups, N, K // 2), dtype=torch.uint8, device="cuda")
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            bq_route, folded = G.fold_fp4_weights(bq, sb)
            flops = 2 * sum(rows) * N * K
            weight_bytes = touched * (bq[0].numel() + sb[0].numel())
            row = {"experts": groups, "mean_rows": mean, "name": name, "rows": sum(rows), "M": M,
                   "touched": touched, "swapab_tile": list(G._masked_tile(mean, True))}
            t, first = {}, None
            used = layout >= 0
            for key, (max_rows, tile) in variants.items():
                G.CONTIGUOUS_SWAPAB_MAX_ROWS = max_rows
                G._masked_tile = routed_tile if tile is None else (lambda *_args, t=tile: t)
                out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
                t[key] = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    x, (bq_route, sb), out, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded,
                    expected_m=mean))
                if first is None:
                    first = out[used].view(torch.int16)
                row[f"bitwise_{key}"] = bool(torch.equal(out[used].view(torch.int16), first))
            G.CONTIGUOUS_SWAPAB_MAX_ROWS, G._masked_tile = routed_max_rows, routed_tile
            bq = bq_route = None  # the peer's FP8 weights in their place
            try:
                t["scaled_grouped_mm"] = ms(scaled_grouped_mm_peer(x[0], ends, groups, N, K))
            except (RuntimeError, ValueError) as e:  # (empty groups, say): the row goes on without the peer
                print("scaled_grouped_mm failed:", repr(e)[:300])
                t["scaled_grouped_mm"] = float("nan")
            for key, v in t.items():
                row[f"us_{key}"] = v * 1e3
                row[f"tflops_{key}"] = flops / v / 1e9
                row[f"frac_of_copy_{key}"] = weight_bytes / v / 1e6 / copy_gbs
                row[f"over_contiguous_{key}"] = t.get("contiguous_kernel", float("nan")) / v
                row[f"over_peer_{key}"] = t["scaled_grouped_mm"] / v
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_contiguous_swapab.json"), "w") as f:
        json.dump(result, f, indent=1)
    names = [*variants, "scaled_grouped_mm"]
    print(f"| experts, rows | GEMM | route's tile | {' | '.join(names)} (TFLOP/s, frac of copy, x contiguous kernel) "
          "| bitwise |")
    for r in result["rows"]:
        cells = " | ".join(f"{r[f'tflops_{k}']:.0f}, {r[f'frac_of_copy_{k}']:.3f}, {r[f'over_contiguous_{k}']:.3f}x"
                           for k in names)
        print(f"| {r['experts']}, ~{r['mean_rows']} | {r['name']} | {r['swapab_tile'][0]}"
              f"{' split' if r['swapab_tile'][4] else ''} | {cells} | {all(r[f'bitwise_{k}'] for k in variants)} |")


if __name__ == "__main__":
    main()
