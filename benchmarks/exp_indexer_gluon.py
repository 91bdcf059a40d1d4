"""Experiment (issue 5, session 29): the dense indexer scores on the Gluon kernel (indexer_gluon_kernel.py) against
the Triton kernel (indexer_kernel.indexer_scores_kernel), at bench_flashmla's indexer shape (4,096 queries x 32 heads
x 128 dims against 65,536 FP4 keys of one sequence) and at the candidate source's (131,072 keys), sweeping the Gluon
launch: keys per CTA (KEY_HALVES x 128), query tiles in flight (QSTAGES) and programs per SM. Each candidate's
scores are compared with the Triton kernel's: equal except, rarely, one bf16 ulp (the 32-head sum's order).
Times: bench_flashmla.bench (do_bench median). Writes $OUT/exp_indexer_gluon.json.

    cd benchmarks && timeout 200 python3 exp_indexer_gluon.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_flashmla import CONTEXT, INDEX_DIM, INDEX_HEADS, S_Q, bench, environment, indexer_prefill_case

import mini_flashmla
from mini_flashmla import api

SWEEP = [(2, 3, 4), (2, 2, 4), (2, 4, 4), (1, 3, 4), (2, 3, 1), (2, 3, 2), (2, 3, 8)]  # (halves, qstages, per SM)


def diff_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    same_inf = torch.equal(torch.isneginf(a), torch.isneginf(b))
    return float((a != b).float().mean()) if same_inf else 1.0


def main() -> None:
    dev = torch.device("cuda")
    result = {**environment(dev), "sweep": {}}
    q, w, cache, visible, rows = indexer_prefill_case(dev)
    cases = {"65536_keys": (rows, visible),
             "131072_keys": (torch.arange(CONTEXT, dtype=torch.int32, device=dev) % cache.shape[0],
                             torch.arange(CONTEXT - S_Q, CONTEXT, device=dev) + 1)}
    for name, (key_rows, vis) in cases.items():
        flop = 2 * S_Q * INDEX_HEADS * INDEX_DIM * key_rows.shape[0]
        heads = api.INDEXER_GLUON_HEADS
        api.INDEXER_GLUON_HEADS = -1  # the Triton kernel
        want = mini_flashmla.indexer_scores(q, w, cache, vis, key_rows)
        t = bench(lambda: mini_flashmla.indexer_scores(q, w, cache, vis, key_rows))
        api.INDEXER_GLUON_HEADS = heads
        rows_out = {"triton": {"ms": t, "tflops": flop / t / 1e9}}
        defaults = (api.INDEXER_GLUON_KEYS, api.INDEXER_GLUON_QSTAGES, api.INDEXER_GLUON_PROGRAMS_PER_SM)
        for halves, qstages, per_sm in SWEEP:
            api.INDEXER_GLUON_KEYS, api.INDEXER_GLUON_QSTAGES, api.INDEXER_GLUON_PROGRAMS_PER_SM = \
                128 * halves, qstages, per_sm
            try:
                got = mini_flashmla.indexer_scores(q, w, cache, vis, key_rows)
                t = bench(lambda: mini_flashmla.indexer_scores(q, w, cache, vis, key_rows))
                rows_out[f"gluon_h{halves}_s{qstages}_p{per_sm}"] = {
                    "ms": t, "tflops": flop / t / 1e9, "vs_triton": rows_out["triton"]["ms"] / t,
                    "differing_fraction": diff_fraction(got, want)}
            except Exception as exc:  # keep the other variants' numbers
                rows_out[f"gluon_h{halves}_s{qstages}_p{per_sm}"] = {"error": repr(exc)[:300]}
        api.INDEXER_GLUON_KEYS, api.INDEXER_GLUON_QSTAGES, api.INDEXER_GLUON_PROGRAMS_PER_SM = defaults
        result["sweep"][name] = rows_out
        del want
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_indexer_gluon.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['gpu']} torch {result['torch']} triton {result['triton']} {result['date_utc']}")
    print("| case | launch | ms | TFLOP/s | vs Triton | differing |\n|---|---|---:|---:|---:|---:|")
    for name, rows_out in result["sweep"].items():
        for launch, r in rows_out.items():
            if "error" in r:
                print(f"| {name} | {launch} | {r['error'][:120]} | | | |")
            else:
                print(f"| {name} | {launch} | {r['ms']:.3f} | {r['tflops']:.0f} | {r.get('vs_triton', 1.0):.2f}x "
                      f"| {r.get('differing_fraction', 0.0):.1e} |")


if __name__ == "__main__":
    main()
