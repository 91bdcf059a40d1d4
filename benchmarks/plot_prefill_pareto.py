"""The prefill Pareto plot (issue 8): uncached input tokens/s per GPU against ms per step, one point per token
count of a bench_prefill.py --sweep, labelled with the tokens per rank, as the official benchmark presents it.

    uv run --with matplotlib benchmarks/plot_prefill_pareto.py benchmarks/prefill_sweep_h200_2026-11-30.json \
        --out docs/figures/prefill_pareto_h200.png

matplotlib is not a project dependency (only this script needs it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="JSON files with a 'sweep' list (bench_prefill.py)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", type=float, action="append", default=[1900.0, 8000.0, 15900.0],
                    help="horizontal target lines, tok/s/GPU (issue 8's H200 targets)")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for path in args.sweeps:
        res = json.loads(path.read_text())
        rows = [r for r in res["sweep"] if "error" not in r]
        env = res["environment"]["hardware"]
        label = f"{env.get('gpu', '?')} x{env.get('gpus_used', 1)}, EP{res['workload'].get('ep_size', 1)}, " \
                f"{res.get('mode', 'full replay')}"
        xs, ys = [r["ms_per_step"] for r in rows], [r["tokens_per_s_per_gpu"] for r in rows]
        ax.plot(xs, ys, marker="o", label=label)
        for r, x, y in zip(rows, xs, ys):
            ax.annotate(f"{r['tokens']:,}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for t in sorted(set(args.target)):
        ax.axhline(t, color="grey", lw=0.8, ls="--")
        ax.annotate(f"target {t:,.0f}", (ax.get_xlim()[1], t), ha="right", va="bottom", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("ms per prefill step (40-layer equivalent)")
    ax.set_ylabel("uncached input tokens/s per GPU")
    ax.set_title("V4.1-Flash prefill, context 131,072 (labels: uncached tokens per rank)", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
