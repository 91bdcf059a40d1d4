"""Experiment (session 41): the hyper-connection mixes' K slice at decode sizes.

Why: the decode breakdown (bench_decode --profile, session 41 run 2) puts hc_mix_partial_kernel at ~43 us per call at
64 tokens (two calls per layer, ~3.4 ms of an ~81 ms 40-layer decode step), where the split-K kernel runs
4 x D / k_slice = 10 programs, each a chain of k_slice / block_k = 32 steps. The slice is a constant so that a token's
mixes do not depend on its batch (hyper_connections.MixConfig); a smaller one shortens every chain at every T.

Measured: hc_mixes_fused (both kernels) at the default tiling (bf16x3, 128 x 64) with K slices of 2,048 (the default),
1,024, 512 and 256, at T = 16, 32, 64 (decode) and 4,096 (prefill), D = 5,120; GPU time by CUDA-graph replay
(exp_gemm_gluon_v3.ms); max abs error against ops.hc_mixes at T = 4,096 (the tests' bar: 1e-5); whether a token's
mixes are bitwise equal at T = 16 and at T = 4,096 for each slice (batch independence). Writes
$OUT/exp_hc_mix_slices.json.

    cd benchmarks && python3 exp_hc_mix_slices.py
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from bench_hc import ERROR_BAR, inputs, max_error
from exp_gemm_gluon_v3 import ms
from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

SLICES = (2048, 1024, 512, 256)
TOKENS = (16, 32, 64, 4096)
D = 5120


def main() -> None:
    cfg = V41Config()
    rows = []
    H, fn, scale, base, _ = inputs(4096, D, "cuda", seed=0)
    want = ops.hc_mixes(H, fn, scale, base, cfg)
    for k_slice in SLICES:
        mix = dataclasses.replace(hcf.DEFAULT_MIX, k_slice=k_slice)
        full = hcf.hc_mixes_fused(H, fn, scale, base, cfg, mix)
        head = hcf.hc_mixes_fused(H[:16].contiguous(), fn, scale, base, cfg, mix)
        row = {"k_slice": k_slice, "max_abs_error": max_error(full, want),
               "batch_independent": all(torch.equal(a[:16], b) for a, b in zip(full, head)), "us": {}}
        for T in TOKENS:
            HT, fnT, scaleT, baseT, _ = inputs(T, D, "cuda", seed=T)
            row["us"][T] = ms(lambda: hcf.hc_mixes_fused(HT, fnT, scaleT, baseT, cfg, mix)) * 1e3
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_hc_mix_slices.json"), "w") as f:
        json.dump({"D": D, "error_bar": ERROR_BAR, "rows": rows}, f, indent=1)
    print(f"| K slice | programs per token block | {' | '.join(f'T = {t}, us' for t in TOKENS)} | max abs error | "
          "batch-independent |")
    for r in rows:
        times = " | ".join(f"{r['us'][t]:.1f}" for t in TOKENS)
        print(f"| {r['k_slice']} | {4 * D // r['k_slice']} | {times} | {r['max_abs_error']:.1e} | "
              f"{r['batch_independent']} |")


if __name__ == "__main__":
    main()
