"""Experiment (issue 4): the V4.1 kernel's scales through the TMA ring as fp32 (session 17) against the UE8M0 words
its math warps load and convert (sessions 12-16), same run, bitwise.

Why (docs/reports/profile-ncu-s17.md): the 128 x 128 kernel is issue-bound (issue slots 70% busy, tensor pipe 31%),
and of its ~565 instructions per warp and K step ~130 load, address and convert the scales: 16 UE8M0 -> fp32
conversions of B's scales on the uniform datapath (extract, shift, mask, compare, select), 8 of A's, the words'
loads a step ahead. With SCALES_IN_RING the producer brings each step's fp32 scales with the operands (A's [4, 128]
of an M-major copy, B's [4, 8]) and the math warps read them from shared memory: 450 instructions per step offline
(triton 3.6, sm_90a), 8 bytes of spill outside the loop. The fp32 copies cost two conversion launches per call
(gemm._f32_scales_transposed), timed here on their own and inside the call.

M = 512, 1,024 and 4,096 at bench_deepgemm's 8 dense shapes, 128 x 128 persistent tiles (the route from 66 tiles),
GPU time by CUDA-graph replay; cuBLAS per-tensor FP8 in the same run. Writes $OUT/exp_gemm_v41_scale_ring.json.

    cd benchmarks && timeout 300 python3 exp_gemm_v41_scale_ring.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G

SMOKE_S = 150


def run(op, d, ring: bool) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, 128, 128, 4, 1, ring)


def smoke(result) -> None:
    """Child process: ragged calls (M 100 and 300, N 160 and 288: partial row tiles, a partial column-block box),
    the ring against the words, bitwise."""
    out = []
    for M, N, K in ((256, 288, 640), (100, 160, 512), (300, 1280, 1280)):
        op = dense_operands(M, N, K)
        want = torch.empty_like(op["d"])
        run(op, want, False)
        op["d"].fill_(float("nan"))
        run(op, op["d"], True)
        torch.cuda.synchronize()
        out.append((M, N, K, bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16)))))
    result.put(out)


def main() -> None:
    smoke_rows = smoke_in_child(smoke, SMOKE_S, "the V4.1 scales-in-ring smoke calls")
    print("smoke, ring bitwise equal to words:", smoke_rows, flush=True)
    if not all(r[-1] for r in smoke_rows):
        raise SystemExit("the ring's output differs from the words': not timed")
    result, rows, one = environment(torch.device("cuda")), [], torch.ones((), device="cuda")
    for M in (512, 1024, 4096):
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            (aq, sa), (bq, sb) = op["v41"]
            d, want = op["d"], torch.empty_like(op["d"])
            run(op, want, False)
            d.fill_(float("nan"))
            run(op, d, True)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K,
                       bitwise=bool(torch.equal(d.view(torch.int16), want.view(torch.int16))),
                       words_tflops=tflop / ms(lambda: run(op, d, False)) * 1e3,
                       ring_tflops=tflop / ms(lambda: run(op, d, True)) * 1e3,
                       conversion_us=ms(lambda: (G._f32_scales_transposed(sa.view(torch.uint8)),
                                                 G._f32_scales_transposed(sb.view(torch.uint8)))) * 1e3,
                       cublas_fp8_tensor_tflops=tflop / ms(lambda: torch._scaled_mm(
                           op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3)
            row["ring_over_words"] = row["ring_tflops"] / row["words_tflops"]
            rows.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v41_scale_ring.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | words | ring (with conversion) | conversion us | cuBLAS tensor | ring / words | ring / cuBLAS "
          "| bitwise |")
    for r in rows:
        print(f"| {r['name']} | {r['M']} | {r['words_tflops']:.0f} | {r['ring_tflops']:.0f} | "
              f"{r['conversion_us']:.1f} | {r['cublas_fp8_tensor_tflops']:.0f} | {r['ring_over_words']:.2f} | "
              f"{r['ring_tflops'] / r['cublas_fp8_tensor_tflops']:.2f} | {r['bitwise']} |")


if __name__ == "__main__":
    main()
