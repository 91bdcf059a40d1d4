"""Hyper-connection kernels (runtime/src/mini_deepinfer/layers/hyper_connections.py) against their peers, one run.

- mixes: the torch reference (ops.hc_mixes) and the split-K kernels at the production tiling (MixConfig()), plus a
  sweep of tilings (token block, feature chunk, K slice, dot mode, warps) with each one's max abs error against
  the reference at --check-tokens. The sweep includes round 2's tiling (one program per 16 tokens over all of K,
  128-feature chunks), which stands in for the replaced single-kernel version; its profiled time, 2.27 ms at 4,096
  tokens, is recorded as `round2_profiled_ms`.
- collapse, expand: the fused kernels and their torch references.
- every op: GB/s over the bytes it must move (reads of H, y, fn; writes of its outputs; not the split-K workspace),
  and the same bytes moved by a torch device copy in the same run (copy_gbs) with the ratio.

Times are medians of triton.testing.do_bench (L2 cleared before each call). Shapes: T tokens x 4 streams x D.
Prints a table last and writes JSON (after each phase) to --out (default $OUT/bench_hc.json or ./bench_hc.json).
CPU smoke run (logic only, TRITON_INTERPRET=1, wall-clock medians):
  TRITON_INTERPRET=1 uv run benchmarks/bench_hc.py --device cpu --d 64 --tokens 1,20 --check-tokens 20 \
      --out /tmp/hc.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import triton
import triton.testing

from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

ROUND2_PROFILED_MS = {4096: 2.27}  # hc_mix_kernel of round 2 (prefill-r2-hc-fused-and-bounded-replay.md)
ERROR_BAR = 1e-5  # test_hyper_connections.py's bar for pre / post / comb


def sweep_configs(K: int) -> list[hcf.MixConfig]:
    """Round 2's tiling (no split; block_k 128), then split-K tilings around the default, both dot modes."""
    whole_k = triton.cdiv(K, 128) * 128
    M = hcf.MixConfig
    return [M(block_t=16, block_k=128, k_slice=whole_k), hcf.DEFAULT_MIX,
            M(block_t=32, block_k=32), M(block_t=64, block_k=64), M(block_t=64, block_k=32, k_slice=1024),
            M(block_t=64, block_k=32, k_slice=4096), M(block_t=128, block_k=32), M(block_t=64, block_k=32, num_warps=8),
            M(dot="bf16x3", block_t=64, block_k=64), M(dot="bf16x3", block_t=64, block_k=32),
            M(dot="bf16x3", block_t=128, block_k=64), M(dot="bf16x3", block_t=64, block_k=128),
            M(dot="bf16x3", block_t=64, block_k=64, k_slice=1024),
            M(dot="bf16x3", block_t=128, block_k=64, k_slice=4096, num_warps=8)]


def median_ms(fn: Callable[[], object], device: str, warmup_ms: int = 5, rep_ms: int = 25) -> float:
    """do_bench's median on CUDA (warm-up and repetition windows in ms); the middle of 3 wall-clock calls on CPU."""
    if device == "cuda":
        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_ms(n_bytes: int, device: str, **timing: int) -> float:
    """A torch device copy that reads n_bytes / 2 and writes n_bytes / 2 (the same bytes as the op); timing: the
    median_ms windows."""
    src = torch.empty(max(n_bytes // 2, 1), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src), device, **timing)


def op_bytes(T: int, D: int) -> dict[str, int]:
    hc = hcf.HC
    h = T * hc * D * 2
    return {"mixes": h + hcf.MIX_COLUMNS * hc * D * 4 + T * hcf.MIX_COLUMNS * 4,
            "collapse": h + T * hc * 4 + T * D * 2,
            "expand": T * D * 2 + h + T * (hc + hc * hc) * 4 + h}


def inputs(T: int, D: int, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(seed)
    hc = hcf.HC
    H = torch.randn(T, hc, D, generator=g, device=device).to(torch.bfloat16)
    fn = torch.randn(hcf.MIX_COLUMNS, hc * D, generator=g, device=device) * (hc * D) ** -0.5
    scale = torch.rand(3, generator=g, device=device) + 0.5
    base = torch.randn(hcf.MIX_COLUMNS, generator=g, device=device) * 0.5
    y = torch.randn(T, D, generator=g, device=device).to(torch.bfloat16)
    return H, fn, scale, base, y


def max_error(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> float:
    return max((a - b).abs().max().item() for a, b in zip(got, want))


def rate(ms: float, n_bytes: int) -> float:
    return n_bytes / ms / 1e6


def write_and_print_table(name: str, result: dict, out_path: str, columns: list[tuple[str, str]],
                          cells: Callable[[dict], list[str]]) -> None:
    """The one-table benchmarks' ending (bench_rmsnorm, bench_rope, bench_fp4_quant): result as JSON to out_path,
    then the environment line and a markdown table of result["rows"]; columns: (title, "l" or "r" alignment),
    cells(row): the row's formatted cells."""
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    env = result["environment"]
    print(f"{name}: {env['hardware']} torch {env['torch']} triton {env['triton']} {env['date']}")
    print("| " + " | ".join(title for title, _ in columns) + " |")
    print("|" + "|".join("---:" if align == "r" else "---" for _, align in columns) + "|")
    for row in result["rows"]:
        print("| " + " | ".join(cells(row)) + " |")


def environment(device: str) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "hardware": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "git_commit": commit, "interpreter": os.environ.get("TRITON_INTERPRET") == "1"}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--d", type=int, default=5120, help="hidden size D (the streams are [T, 4, D])")
    ap.add_argument("--tokens", default="1,64,4096,16384")
    ap.add_argument("--check-tokens", type=int, default=4096, help="T of the sweep's error check")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_hc.json"))
    args = ap.parse_args(argv)
    device, D = args.device, args.d
    token_counts = [int(t) for t in args.tokens.split(",")]
    cfg = V41Config()
    configs = sweep_configs(hcf.HC * D)
    result = {"environment": environment(device),
              "shapes": {"streams": hcf.HC, "D": D, "K": hcf.HC * D, "mix_columns": hcf.MIX_COLUMNS,
                         "tokens": token_counts},
              "method": "triton.testing.do_bench median (warmup 5 ms, rep 25 ms, L2 cleared per call)",
              "round2_profiled_ms": ROUND2_PROFILED_MS, "default_mix": dataclasses.asdict(hcf.DEFAULT_MIX),
              "error_bar": ERROR_BAR, "sweep": [], "by_tokens": []}

    def save() -> None:  # after each phase, so a run cut at its time limit still leaves what it measured
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    H, fn, scale, base, _ = inputs(args.check_tokens, D, device, seed=0)
    want = ops.hc_mixes(H, fn, scale, base, cfg)
    sweep_tokens = [t for t in token_counts if t > 1]
    for mix in configs:
        row = {"mix": dataclasses.asdict(mix), "max_abs_error": None, "ms": {}}
        try:
            row["max_abs_error"] = max_error(hcf.hc_mixes_fused(H, fn, scale, base, cfg, mix), want)
            for T in sweep_tokens:
                HT, fnT, scaleT, baseT, _ = inputs(T, D, device, seed=T)
                row["ms"][str(T)] = median_ms(lambda: hcf.hc_mixes_fused(HT, fnT, scaleT, baseT, cfg, mix), device)
        except Exception as e:  # a tiling this GPU cannot compile or run is recorded, and the sweep goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        result["sweep"].append(row)
        save()
    del H, want

    def fastest(dot: str) -> hcf.MixConfig | None:
        """The sweep's fastest tiling of a dot mode at the largest T, among those within the error bar."""
        ok = [r for r in result["sweep"]
              if r["mix"]["dot"] == dot and "error" not in r and r["max_abs_error"] <= ERROR_BAR]
        big = str(max(sweep_tokens)) if sweep_tokens else None
        return hcf.MixConfig(**min(ok, key=lambda r: r["ms"][big])["mix"]) if ok and big else None

    best = {dot: fastest(dot) for dot in ("ieee", "bf16x3")}
    result["fastest"] = {dot: dataclasses.asdict(m) if m else None for dot, m in best.items()}

    for T in token_counts:
        H, fn, scale, base, y = inputs(T, D, device, seed=T)
        pre, post, comb = ops.hc_mixes(H, fn, scale, base, cfg)
        n_bytes = op_bytes(T, D)
        ms = {"mixes_torch": median_ms(lambda: ops.hc_mixes(H, fn, scale, base, cfg), device),
              "mixes_fused": median_ms(lambda: hcf.hc_mixes_fused(H, fn, scale, base, cfg), device),
              "collapse_torch": median_ms(lambda: ops.hc_collapse(H, pre), device),
              "collapse_fused": median_ms(lambda: hcf.hc_collapse_fused(H, pre), device),
              "expand_torch": median_ms(lambda: ops.hc_expand(y, H, post, comb), device),
              "expand_fused": median_ms(lambda: hcf.hc_expand_fused(y, H, post, comb), device)}
        for dot, mix in best.items():
            if mix is not None:
                ms[f"mixes_fastest_{dot}"] = median_ms(lambda: hcf.hc_mixes_fused(H, fn, scale, base, cfg, mix), device)
        copies = {op: copy_ms(b, device) for op, b in n_bytes.items()}
        copy_gbs = {op: rate(copies[op], b) for op, b in n_bytes.items()}
        op_of = {name: name.split("_")[0] for name in ms}  # "mixes_fastest_ieee" -> "mixes"
        gbs = {name: rate(t, n_bytes[op_of[name]]) for name, t in ms.items()}
        result["by_tokens"].append({
            "T": T, "bytes": n_bytes, "ms": ms, "gbs": gbs, "copy_ms": copies, "copy_gbs": copy_gbs,
            "fraction_of_copy": {name: gbs[name] / copy_gbs[op_of[name]] for name in ms}})
        save()
        del H, fn, y, pre, post, comb

    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    env = result["environment"]
    print(f"bench_hc: {env['hardware']} torch {env['torch']} triton {env['triton']} {env['date']}"
          f" D={result['shapes']['D']}")
    print("sweep (ms per call by T; max abs error at the check T):")
    for r in result["sweep"]:
        m = r["mix"]
        measured = r.get("error") or (f"err={r['max_abs_error']:.1e}  "
                                      + " ".join(f"{t}:{v:.4f}" for t, v in r["ms"].items()))
        tiling = (f"{m['dot']:6s} bt={m['block_t'] or 'T':>3} bk={m['block_k']:3d} slice={m['k_slice']:5d} "
                  f"w={m['num_warps']}")
        print(f"  {tiling}  {measured}"[:300])
    print(f"fastest within {result['error_bar']:.0e}: {result['fastest']}")
    for row in result["by_tokens"]:
        parts = [f"{name} {t:.4f} ms ({row['fraction_of_copy'][name]:.2f}x copy)" for name, t in row["ms"].items()]
        print(f"T={row['T']}: copy GB/s {row['copy_gbs']['mixes']:.0f} | " + "; ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1:])
