"""Experiment (issue 4): the V4.1 kernel's 128 x 128 tiles with a 5-deep TMA ring against the shipped 4, both scale
forms, same run, bitwise.

Why: after session 18's one-MMA change the kernel issues 18% fewer instructions but runs only 1.02x faster (ncu,
wo_b at M = 4,096, docs/reports/data/s18-run1/): issue slots 52% busy, 13% of stall samples long-scoreboard. If the
math warps wait on the ring (the producer's TMA copies), a deeper ring hides more of it. Shared memory per program:
4 stages 164 KB (words) / 169 KB (ring), 5 stages 196 / 203 KB (of 227 KB); 6 do not fit with the ring.

M = 1,024 and 4,096 at bench_deepgemm's 8 dense shapes, persistent tiles, GPU time by CUDA-graph replay
(exp_gemm_v41_one_mma.variant_rows; cuBLAS per-tensor FP8 as the peer since the review after run 3).

    cd benchmarks && timeout 200 python3 exp_gemm_v41_stages.py
"""

from __future__ import annotations

import functools
import json
import os

import torch

from bench_flashmla import environment  # beside this script
from exp_gemm_v41_one_mma import variant_rows
from mini_deepgemm import gemm as G


def call(op, d, stages: int, ring: bool) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, 128, 128, stages, 1, ring)


def main() -> None:
    result = environment(torch.device("cuda"))
    calls = {f"{'ring' if ring else 'words'}_s{stages}": functools.partial(call, stages=stages, ring=ring)
             for ring in (False, True) for stages in (4, 5)}
    rows = variant_rows(calls, "words_s4", (1024, 4096))
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v41_stages.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | words 4 | words 5 | ring 4 | ring 5 | words 5/4 | ring 5/4 | bitwise |")
    for r in rows:
        print(f"| {r['name']} | {r['M']} | {r['words_s4_tflops']:.0f} | {r['words_s5_tflops']:.0f} | "
              f"{r['ring_s4_tflops']:.0f} | {r['ring_s5_tflops']:.0f} | "
              f"{r['words_s5_tflops'] / r['words_s4_tflops']:.2f} | {r['ring_s5_tflops'] / r['ring_s4_tflops']:.2f} | "
              f"{r['bitwise']} |")


if __name__ == "__main__":
    main()
