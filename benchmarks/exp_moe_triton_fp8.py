"""The Triton FP8-MMA route of the grouped FP8 x FP4 GEMMs (gemm_fp4_e4m3_kernel.py, session 73) against the route
it replaces off Hopper's Gluon kernels (the bf16-MMA Triton kernels on unfolded weights) and against the Gluon FP8-MMA
kernels, in one process, with a sweep of the Triton kernel's tiles (docs/reports/triton-route-on-hopper.md).

Run with MINI_DEEPGEMM_GLUON=0 so the package's own routing is the Triton route's (the script turns the kernel's
switch MINI_DEEPGEMM_TRITON_FP8_MOE on for its own process); the Gluon column launches
gemm._fp4_e4m3_gemm directly (it needs triton 3.6 on Hopper). Shapes: bench_fp4_e4m3_route.py's (w13 4,608 x 5,120,
w2 5,120 x 2,304; contiguous 96 experts of 128-1,024 rows and 384 of 32-96; masked 96 experts of Poisson(8) and
Poisson(32) rows). Activations folded per 128 (the engine's form). GPU time by CUDA-graph replay
(`exp_gemm_gluon_v3.ms`). Every Triton tile is compared with the reference-equivalent Gluon output (calc_diff).
Writes $OUT/exp_moe_triton_fp8.json.

    cd benchmarks && MINI_DEEPGEMM_GLUON=0 timeout 400 python3 exp_moe_triton_fp8.py
"""

from __future__ import annotations

import json
import os

import torch

os.environ["MINI_DEEPGEMM_TRITON_FP8_MOE"] = "1"  # read once, at the first folded call

from bench_deepgemm import (FP4_SCALE_BOUND, contiguous_operands, copy_bandwidth_gbs, masked_operands,  # beside this
                            rand_fp4_weight_scales)
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128
from mini_deepgemm.testing import calc_diff

# (BLOCK_N, BLOCK_M, num_warps, num_stages) of gemm_fp4_e4m3_kernel's launches, the shipped tiles
# (gemm.FP4_E4M3_TRITON_CONTIGUOUS, FP4_E4M3_TRITON_MASKED) among them. Session 75 run 1 also timed the D = X W^T form
# and late promotion, both removed since (docs/reports/triton-route-on-hopper.md).
TILE_KEYS = ("BLOCK_N", "BLOCK_M", "num_warps", "num_stages")
CONTIGUOUS_TILES = [dict(zip(TILE_KEYS, t)) for t in (
    (256, 64, 8, 3), (256, 64, 8, 4), (256, 32, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3))]
MASKED_TILES = [dict(zip(TILE_KEYS, t)) for t in (
    (128, 16, 4, 4), (64, 16, 4, 4), (128, 16, 4, 3), (128, 32, 4, 3), (128, 32, 4, 4), (256, 32, 8, 3),
    (128, 64, 4, 3), (256, 64, 8, 3))]


def _triton_tiles(calls: dict, fp8_call, tiles: list[dict], masked_key: int | None) -> None:
    """Adds one call per tile of the Triton kernel, each launching with that tile (the module's tables patched for
    the call's duration)."""
    for tile in tiles:
        def call(tile=tile):
            saved = G.FP4_E4M3_TRITON_CONTIGUOUS, dict(G.FP4_E4M3_TRITON_MASKED)
            if masked_key is None:
                G.FP4_E4M3_TRITON_CONTIGUOUS = tile
            else:
                G.FP4_E4M3_TRITON_MASKED[masked_key] = tile
            try:
                fp8_call()
            finally:
                G.FP4_E4M3_TRITON_CONTIGUOUS, G.FP4_E4M3_TRITON_MASKED = saved
        calls["triton_fp8 " + " ".join(f"{k}={v}" for k, v in tile.items())] = call


def _timed(row: dict, calls: dict, outs: dict, used: torch.Tensor, unit: str, rate) -> dict:
    """row with each call timed: row[name] = {"us", unit: rate(ms)}, and for the Triton kernel's tiles the diff of
    their output against the Gluon kernels' (outs, on the used rows); printed as a JSON line."""
    for name, fn in calls.items():
        t = ms(fn)
        row[name] = {"us": t * 1e3, unit: rate(t)}
        if name.startswith("triton_fp8"):
            row[name]["diff_vs_gluon"] = float(calc_diff(outs["triton"][used].float(), outs["gluon"][used].float()))
    print(json.dumps(row), flush=True)
    return row


def contiguous_rows(gen) -> list[dict]:
    out = []
    for groups, rows_range in ((96, (128, 1024)), (384, (32, 96))):
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            bq_route, folded = G.fold_fp4_weights(bq, sb)
            a128 = fold_ue8m0_to_128(a, sa, 1)
            outs = {k: torch.zeros_like(d) for k in ("gluon", "triton", "bf16")}
            calls = {
                "triton_bf16_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                    (a, sa), (bq, sb), outs["bf16"], layout, weight_scale_max=FP4_SCALE_BOUND),
                "scaled_grouped_mm_fp8": scaled_grouped_mm_peer(a, ends, groups, N, K),
            }
            calls["gluon_fp8"] = lambda: G._fp4_e4m3_gemm(G._CONTIGUOUS, a128, (bq_route, sb), outs["gluon"], layout,
                                                          folded, None)
            _triton_tiles(calls, lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
                a128, (bq_route, sb), outs["triton"], layout, folded=folded), CONTIGUOUS_TILES, None)
            flops = 2 * sum(rows) * N * K
            used = layout >= 0
            row = {"layout": "contiguous", "groups": groups, "rows_range": rows_range, "name": name, "N": N, "K": K,
                   "rows": sum(rows)}
            out.append(_timed(row, calls, outs, used, "tflops", lambda t: flops / t / 1e9))
            torch.cuda.empty_cache()
    return out


def masked_rows(copy_gbs: float) -> list[dict]:
    out = []
    for expected_m in (8, 32):
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            bq_route, folded = G.fold_fp4_weights(bq, sb)
            a128 = fold_ue8m0_to_128(a, sa, 1)
            outs = {k: torch.zeros_like(d) for k in ("gluon", "triton", "bf16")}
            calls = {
                "triton_bf16_route": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                    (a, sa), (bq, sb), outs["bf16"], masked_m, expected_m, weight_scale_max=FP4_SCALE_BOUND),
                "gluon_fp8": lambda: G._fp4_e4m3_gemm(G._MASKED, a128, (bq_route, sb), outs["gluon"], masked_m,
                                                      folded, expected_m),
            }
            key = 16 if expected_m <= 16 else 32
            _triton_tiles(calls, lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                a128, (bq_route, sb), outs["triton"], masked_m, expected_m, folded=folded), MASKED_TILES, key)
            weight_bytes = bq.numel() + sb.numel()
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            row = {"layout": "masked", "groups": 96, "expected_m": expected_m, "name": name, "N": N, "K": K,
                   "rows": int(masked.sum()), "copy_gbs": copy_gbs}
            out.append(_timed(row, calls, outs, used, "frac_of_copy", lambda t: weight_bytes / t / 1e6 / copy_gbs))
            torch.cuda.empty_cache()
    return out


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")),
              "switch": os.environ.get("MINI_DEEPGEMM_GLUON"), "rows": contiguous_rows(gen)}
    copy_gbs = copy_bandwidth_gbs()
    torch.cuda.empty_cache()
    result["rows"] += masked_rows(copy_gbs)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_triton_fp8.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        unit = "tflops" if r["layout"] == "contiguous" else "frac_of_copy"
        label = (f"contiguous {r['groups']} x {r['rows_range']}" if r["layout"] == "contiguous"
                 else f"masked ~{r['expected_m']}")
        cells = ", ".join(f"{k}: {v[unit]:.2f}" + (f" (diff {v['diff_vs_gluon']:.1e})" if "diff_vs_gluon" in v else "")
                          for k, v in r.items() if isinstance(v, dict))
        print(f"| {label} | {r['name']} | {unit} | {cells} |")


if __name__ == "__main__":
    main()
