"""Experiment (session 43): the hyper-connection mix kernels' token blocks at decode sizes.

Why: at a decode step's 64 tokens the split-K partial kernel runs one token block of 128 x 20 K slices, 20 programs
on 132 SMs (22.5 us a call in session 42's decode profile, 2 calls per layer), and the finish kernel 2 programs of
32 tokens (8.0 us). The slices (k_slice) set the summation order, so they stay; the token block does not enter a
token's sums (each chunk's MMA starts from a fresh accumulator, and the finish kernel's arithmetic is per token),
so smaller blocks could fill the GPU without changing a bit. Whether the MMA's own sum is the same at every M
(mma.sync below 64 rows, wgmma from 64) is what this checks, with the time.

Cases: T = 1, 16, 64, 128, 512, 4,096 tokens x 4 streams x 5,120 (V4.1-Flash); the partial kernel's block_t 16 / 32 /
64 / 128 (the default) and the finish kernel's 8 / 16 / 32 (the default); every output compared bitwise with the
default tiling. GPU time by CUDA-graph replay. Writes $OUT/exp_hc_decode_tiles.json and prints a markdown table.

    cd benchmarks && python3 exp_hc_decode_tiles.py
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from bench_flashmla import environment
from bench_hc import inputs
from exp_gemm_gluon_v3 import ms
from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41.config import V41Config

TOKENS = (1, 16, 64, 128, 512, 4096)
BLOCK_T = (16, 32, 64, 128)
FINISH_BLOCK_T = (8, 16, 32)


def main() -> None:
    cfg = V41Config()
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    default_finish = hcf.FINISH_BLOCK_T
    for T in TOKENS:
        H, fn, scale, base, _ = inputs(T, cfg.hidden_size, "cuda", seed=43)
        want = hcf.hc_mixes_fused(H, fn, scale, base, cfg)
        row = {"tokens": T}
        for block_t in BLOCK_T:
            for finish in FINISH_BLOCK_T:
                hcf.FINISH_BLOCK_T = finish
                mix = dataclasses.replace(hcf.DEFAULT_MIX, block_t=block_t)
                got = hcf.hc_mixes_fused(H, fn, scale, base, cfg, mix)
                key = f"{block_t}_{finish}"
                row[f"bitwise_{key}"] = all(torch.equal(g.view(torch.int32), w.view(torch.int32))
                                            for g, w in zip(got, want))
                row[f"us_{key}"] = ms(lambda mix=mix, op=(H, fn, scale, base): hcf.hc_mixes_fused(*op, cfg, mix)) * 1e3
        hcf.FINISH_BLOCK_T = default_finish
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_hc_decode_tiles.json"), "w") as f:
        json.dump(result, f, indent=1)
    keys = [f"{b}_{f}" for b in BLOCK_T for f in FINISH_BLOCK_T]
    print("| tokens | " + " | ".join(f"block {k.replace('_', ' / finish ')}" for k in keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    for r in result["rows"]:
        cells = [f"{r[f'us_{k}']:.1f}{'' if r[f'bitwise_{k}'] else ' (bits differ)'}" for k in keys]
        print(f"| {r['tokens']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
