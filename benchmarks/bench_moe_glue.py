"""The routed-expert MoE glue (models/deepseek_v41/moe.py): the torch chains against the fused Triton kernels of
runtime/src/mini_deepinfer/layers/moe_kernels.py, piece by piece, one run.

Pieces (old = torch chain in moe.py, new = kernel):
- gather:  quant_gather_torch (quantize T rows, gather all M rows of the layout)  vs  quant_scatter (quantize T
  rows, write their T*k real rows only);
- swiglu:  swiglu_weight_quant_torch over all M rows  vs  swiglu_weight_quant over the listed real rows (pair_row;
  at the contiguous shape also timed with its grid over every layout row, the EP path's form);
- combine: combine_torch (k row gathers + fp32 adds + shared + bf16 cast)  vs  combine.

Shapes: real V4.1-Flash dims from V41Config (hidden 5,120, moe_intermediate 2,304, 384 experts, top-6).
- prefill: T = 4,096 tokens, the fixed-size contiguous layout of moe.contiguous_plan (M = max_rows: every pair
  plus 127 padding rows per expert, ~73k rows of which 24,576 are real);
- decode: T = 64 tokens, moe.masked_plan (M = 384 x 64 rows, 384 real).
Routing: top-k of random logits (near-uniform over the experts), weights in (0, 1).

Bytes per piece are what the fused kernel must move (real rows only, the row list read included; until session 5's
review the SwiGLU count read the layout / masked_m instead, < 0.1% of its bytes), and
`copy_gbs` is a torch device copy of the same bytes in the same run; fraction_of_copy = GB/s / copy GB/s. The old
chain's GB/s is over the same bytes (useful work), so both columns compare. Each piece's outputs are also compared
on the real rows (exact-match fractions; the tests are the authority).
Times: triton.testing.do_bench medians (warm-up 25 ms, 100 ms of repetitions, L2 cleared before each call) on
CUDA; wall-clock medians of 3 calls on CPU (smoke only). `--sweep` adds swiglu_weight_quant tilings.
Prints a table and writes JSON to --out (after each shape, so a run cut short keeps what it measured).

GPU, from the repo root:  python3 benchmarks/bench_moe_glue.py --sweep --out $OUT/bench_moe_glue.json
CPU smoke (logic only): TRITON_INTERPRET=1 uv run benchmarks/bench_moe_glue.py --device cpu --hidden 128 \\
    --inter 256 --experts 32 --prefill-tokens 70 --decode-tokens 8 --out /tmp/moe_glue.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import bench_hc
import torch
from bench_hc import environment, rate

from mini_deepinfer.layers import moe_kernels as mk
from mini_deepinfer.models.deepseek_v41 import moe
from mini_deepinfer.models.deepseek_v41.config import V41Config

WARMUP_MS, REP_MS = 25, 100
SWEEP = [(8, 8), (4, 8), (16, 8), (2, 16), (4, 16), (8, 4), (16, 4), (32, 2), (1, 32)]  # (block_m, groups/program)


def median_ms(fn: Callable[[], object], device: str) -> float:
    return bench_hc.median_ms(fn, device, warmup_ms=WARMUP_MS, rep_ms=REP_MS)


def copy_ms(n_bytes: int, device: str) -> float:
    """The device-copy peer, timed like the kernels (until session 5's review it used bench_hc's shorter windows)."""
    return bench_hc.copy_ms(n_bytes, device, warmup_ms=WARMUP_MS, rep_ms=REP_MS)


def piece_bytes(T: int, k: int, D: int, inter: int) -> dict[str, int]:
    """Bytes the fused kernels must move (real rows R = T*k only, and their int64 row list)."""
    R = T * k
    fp8_row = lambda n: n + n // mk.QUANT_GROUP  # e4m3 row + UE8M0 scales
    return {"gather": T * D * 2 + R * 8 + R * fp8_row(D),
            "swiglu": R * 8 + R * (2 * inter * 2 + 4) + R * fp8_row(inter),
            "combine": R * 8 + R * D * 2 + T * D * 2 + T * D * 2}


def equal_fraction(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """Fraction of equal bytes (of `rows` only, if given; indexed as bytes: not every backend indexes FP8)."""
    a, b = a.view(torch.uint8), b.view(torch.uint8)
    if rows is not None:
        a, b = a[rows], b[rows]
    return (a == b).float().mean().item()


def run_shape(name: str, T: int, cfg: V41Config, E: int, D: int, inter: int, device: str, sweep: bool) -> dict:
    k = cfg.num_experts_per_tok
    g = torch.Generator(device=device).manual_seed(T)
    idx = torch.randn(T, E, generator=g, device=device).topk(k, dim=1).indices
    wt = torch.rand(T, k, generator=g, device=device)
    masked = T <= moe.MASKED_MAX_TOKENS
    plan = (moe.masked_plan if masked else moe.contiguous_plan)(idx, wt, E)
    M = plan.row_weight.shape[0]
    real = plan.pair_row.flatten()
    x = torch.randn(T, D, generator=g, device=device).to(torch.bfloat16)
    h13 = (torch.randn(M, 2 * inter, generator=g, device=device) * 4).to(torch.bfloat16)
    out = torch.randn(M, D, generator=g, device=device).to(torch.bfloat16)
    shared = torch.randn(T, D, generator=g, device=device).to(torch.bfloat16)
    lim = cfg.swiglu_limit
    layout = plan.grouped_layout

    calls = {
        "gather": (lambda: moe.quant_gather_torch(x, plan.row_token), lambda: mk.quant_scatter(x, plan.pair_row, M)),
        "swiglu": (lambda: moe.swiglu_weight_quant_torch(h13, plan.row_weight, lim),
                   lambda: mk.swiglu_weight_quant(h13, plan.row_weight, lim, rows=plan.pair_row)),
        "combine": (lambda: moe.combine_torch(out, plan.pair_row, shared),
                    lambda: mk.combine(out, plan.pair_row, shared)),
    }
    check = {}
    for piece, (old, new) in calls.items():
        a, b = old(), new()
        if piece == "combine":
            check[piece] = {"y": equal_fraction(a, b)}
        else:
            check[piece] = {"q": equal_fraction(a[0], b[0], real), "scale": equal_fraction(a[1], b[1], real)}

    n_bytes = piece_bytes(T, k, D, inter)
    ms, gbs, copies, copy_gbs, fraction = {}, {}, {}, {}, {}
    for piece, (old, new) in calls.items():
        ms[piece] = {"old": median_ms(old, device), "new": median_ms(new, device)}
        copies[piece] = copy_ms(n_bytes[piece], device)
        copy_gbs[piece] = rate(copies[piece], n_bytes[piece])
        gbs[piece] = {v: rate(t, n_bytes[piece]) for v, t in ms[piece].items()}
        fraction[piece] = {v: gbs[piece][v] / copy_gbs[piece] for v in ms[piece]}
    row = {"shape": name, "T": T, "topk": k, "experts": E, "hidden": D, "inter": inter, "layout":
           "masked" if masked else "contiguous", "rows_M": M, "real_rows": T * k, "bytes": n_bytes, "ms": ms,
           "speedup": {p: ms[p]["old"] / ms[p]["new"] for p in ms}, "gbs": gbs, "copy_ms": copies,
           "copy_gbs": copy_gbs, "fraction_of_copy": fraction, "equal_fraction_real_rows": check,
           "total_ms": {v: sum(ms[p][v] for p in ms) for v in ("old", "new")},
           # the SwiGLU kernel with its grid over every row of the contiguous layout (padding masked), as the EP path
           # runs it and as it was first written for both layouts (the masked form: run 4's JSON)
           "swiglu_layout_grid_ms": None if masked else median_ms(
               lambda: mk.swiglu_weight_quant(h13, plan.row_weight, lim, grouped_layout=layout), device)}
    if sweep:
        row["swiglu_sweep"] = []
        for bm, gpp in SWEEP:
            entry = {"block_m": bm, "groups_per_program": gpp}
            try:
                fn = lambda: mk.swiglu_weight_quant(h13, plan.row_weight, lim, rows=plan.pair_row, block_m=bm,
                                                    groups_per_program=gpp)
                got = fn()
                entry["q_equal_to_default"] = equal_fraction(got[0], calls["swiglu"][1]()[0], real)
                entry["ms"] = median_ms(fn, device)
                entry["fraction_of_copy"] = rate(entry["ms"], n_bytes["swiglu"]) / copy_gbs["swiglu"]
            except Exception as e:  # a tiling this GPU cannot compile is recorded, and the sweep goes on
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["swiglu_sweep"].append(entry)
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=None, help="override V41Config.hidden_size (CPU smoke)")
    ap.add_argument("--inter", type=int, default=None, help="override V41Config.moe_intermediate_size")
    ap.add_argument("--experts", type=int, default=None, help="override V41Config.n_routed_experts")
    ap.add_argument("--sweep", action="store_true", help="also time swiglu_weight_quant tilings")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_moe_glue.json"))
    args = ap.parse_args(argv)
    if args.decode_tokens > moe.MASKED_MAX_TOKENS or args.prefill_tokens <= moe.MASKED_MAX_TOKENS:
        raise SystemExit(f"decode tokens must be <= {moe.MASKED_MAX_TOKENS} (masked), prefill tokens above")
    cfg = V41Config()
    D = args.hidden or cfg.hidden_size
    inter = args.inter or cfg.moe_intermediate_size
    E = args.experts or cfg.n_routed_experts
    result = {"environment": environment(args.device),
              "method": f"triton.testing.do_bench median (warmup {WARMUP_MS} ms, rep {REP_MS} ms, L2 cleared per "
                        "call); bytes = the fused kernels' minimal traffic; copy = torch device copy of those bytes",
              "kernel_defaults": {"swiglu_block_m": mk.SWIGLU_BLOCK_M,
                                  "swiglu_groups_per_program": mk.SWIGLU_GROUPS_PER_PROGRAM,
                                  "scatter_groups_per_program": mk.SCATTER_GROUPS_PER_PROGRAM,
                                  "combine_block": [mk.COMBINE_BLOCK_T, mk.COMBINE_BLOCK_D]},
              "num_hidden_layers": cfg.num_hidden_layers, "shapes": []}

    def save() -> None:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    with torch.no_grad():
        for name, T in (("prefill", args.prefill_tokens), ("decode", args.decode_tokens)):
            result["shapes"].append(run_shape(name, T, cfg, E, D, inter, args.device, args.sweep))
            save()
    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    env = result["environment"]
    print(f"bench_moe_glue: {env['hardware']} torch {env['torch']} triton {env['triton']} {env['date']}")
    for row in result["shapes"]:
        print(f"{row['shape']}: T={row['T']} top-{row['topk']} of {row['experts']}, {row['layout']} layout, "
              f"M={row['rows_M']} rows ({row['real_rows']} real), D={row['hidden']}, I={row['inter']}")
        print(f"  {'piece':8s} {'old ms':>9s} {'new ms':>9s} {'speedup':>8s} {'MB':>8s} {'new GB/s':>9s} "
              f"{'copy GB/s':>9s} {'new/copy':>8s}  equal (real rows)")
        for p, t in row["ms"].items():
            eq = " ".join(f"{n}={100 * v:.3f}%" for n, v in row["equal_fraction_real_rows"][p].items())
            print(f"  {p:8s} {t['old']:9.4f} {t['new']:9.4f} {row['speedup'][p]:7.1f}x "
                  f"{row['bytes'][p] / 1e6:8.1f} {row['gbs'][p]['new']:9.0f} {row['copy_gbs'][p]:9.0f} "
                  f"{row['fraction_of_copy'][p]['new']:8.2f}  {eq}")
        tot = row["total_ms"]
        print(f"  {'total':8s} {tot['old']:9.4f} {tot['new']:9.4f} {tot['old'] / tot['new']:7.1f}x   "
              f"(x {result['num_hidden_layers']} layers: {tot['old'] * result['num_hidden_layers']:.1f} -> "
              f"{tot['new'] * result['num_hidden_layers']:.1f} ms)")
        if row["swiglu_layout_grid_ms"] is not None:
            print(f"  swiglu with its grid over every layout row (the EP path's form): {row['swiglu_layout_grid_ms']:.4f} ms")
        for e in row.get("swiglu_sweep", []):
            what = e.get("error") or f"{e['ms']:.4f} ms ({e['fraction_of_copy']:.2f}x copy)"
            print(f"    swiglu tile {e['block_m']:2d} rows x {e['groups_per_program']:2d} groups: {what}")


if __name__ == "__main__":
    main(sys.argv[1:])
