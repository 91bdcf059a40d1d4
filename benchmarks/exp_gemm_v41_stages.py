"""Experiment (issue 4): the V4.1 kernel's 128 x 128 tiles with a 5-deep TMA ring against the shipped 4, both scale
forms, same run, bitwise.

Why: after session 18's one-MMA change the kernel issues 18% fewer instructions but runs only 1.02x faster (ncu,
wo_b at M = 4,096, docs/reports/data/s18-run1/): issue slots 52% busy, 13% of stall samples long-scoreboard. If the
math warps wait on the ring (the producer's TMA copies), a deeper ring hides more of it. Shared memory per program:
4 stages 164 KB (words) / 169 KB (ring), 5 stages 196 / 203 KB (of 227 KB); 6 do not fit with the ring.

M = 1,024 and 4,096 at bench_deepgemm's 8 dense shapes, persistent tiles, GPU time by CUDA-graph replay.

    cd benchmarks && timeout 200 python3 exp_gemm_v41_stages.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G


def call(op, d, stages: int, ring: bool) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, 128, 128, stages, 1, ring)


def main() -> None:
    result, rows = environment(torch.device("cuda")), []
    for M in (1024, 4096):
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            d, want = op["d"], torch.empty_like(op["d"])
            call(op, want, 4, False)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K, bitwise=True)
            for ring in (False, True):
                for stages in (4, 5):
                    d.fill_(float("nan"))
                    call(op, d, stages, ring)
                    row["bitwise"] &= bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                    row[f"{'ring' if ring else 'words'}_s{stages}_tflops"] = tflop / ms(
                        lambda: call(op, d, stages, ring)) * 1e3
            rows.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
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
