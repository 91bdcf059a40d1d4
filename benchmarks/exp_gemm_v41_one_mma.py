"""Experiment (issue 4): the V4.1 kernel's 128 x 128 tiles with one m64n128k32 MMA per 32 of K (session 18) against
four m64n32k32 MMAs (sessions 12-17), both scale forms, same run, bitwise.

Why (docs/reports/profile-ncu-s17.md): the 128 x 128 kernel is issue-bound, and Triton builds each MMA's
shared-memory descriptors afresh (uniform IADD/SHF/SGXT/MOV per MMA). Four MMAs per K block, one per 32-column
block, made 16 per K step; one MMA over the block's 128 columns makes 4, with each element's B scale selected by its
column block (a constant of its register, so the selects fold). Offline (triton 3.6, sm_90a, ptxas): 565 -> 481
SASS instructions per warp and K step with the UE8M0 words, 450 -> 369 with the scales in the ring; same FFMA and
FMUL counts. The before kernel is the session-17 module (commit 62bf345), loaded from a file (--before):

    git show 62bf345:packages/mini-deepgemm/src/mini_deepgemm/gemm_gluon_fp8_kernel.py > /tmp/v41_s17.py
    cd benchmarks && timeout 300 python3 exp_gemm_v41_one_mma.py --before /tmp/v41_s17.py

M = 512, 1,024 and 4,096 at bench_deepgemm's 8 dense shapes, 128 x 128 persistent tiles (one program per SM), whole
calls (the ring's two scale conversions included), GPU time by CUDA-graph replay; cuBLAS per-tensor FP8 in the same
run. Writes $OUT/exp_gemm_v41_one_mma.json.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os

import torch

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm._backend import cdiv

SMOKE_S = 150


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("v41_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launch(kernels, op, d, ring: bool, d_box: int) -> None:
    """gemm._gluon_fp8_v41_gemm's launch of 128 x 128 persistent tiles with `kernels`' fp8_gemm_v41_kernel; d_box:
    the output box's columns (session 17's kernel stores [64, 32] boxes, session 18's one [64, 128])."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (aq, sa), (bq, sb) = op["v41"]
    sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    M, K = aq.shape
    N = bq.shape[0]
    sa_desc = sb_desc = None
    if ring:
        sa_desc = TensorDescriptor.from_tensor(G._f32_scales_transposed(sa), [4, 128], G._unswizzled_f32_layout())
        sb_desc = TensorDescriptor.from_tensor(G._f32_scales_transposed(sb), [4, 8], G._unswizzled_f32_layout())
    grid, maxnreg = G._dense_gluon_launch(cdiv(M, 128) * cdiv(N, 128), 128, 1, d.device)
    kernels.fp8_gemm_v41_kernel[grid](
        G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (128, 128)), G._tma_desc(d, (64, d_box)),
        sa.view(torch.int32), sb.view(torch.int32), sa_desc, sb_desc, M, N, K, sa.stride(0) // 4, sb.stride(0) // 4,
        STAGES=4, GROUP_M=8, CONSUMER_REGS=G._GLUON_CONSUMER_REGS, PRODUCER_REGS=G._GLUON_PRODUCER_REGS,
        SCALES_IN_RING=ring, num_warps=4, maxnreg=maxnreg)


def variants(before) -> dict:
    from mini_deepgemm import gemm_gluon_fp8_kernel as after

    return {"words_before": lambda op, d: launch(before, op, d, False, 32),
            "ring_before": lambda op, d: launch(before, op, d, True, 32),
            "words_after": lambda op, d: launch(after, op, d, False, 128),
            "ring_after": lambda op, d: launch(after, op, d, True, 128)}


def variant_rows(calls: dict, reference: str, Ms) -> list[dict]:
    """Per M x bench_deepgemm dense shape: every call (name -> fn(op, d)) timed as TFLOP/s (CUDA-graph replay) and its
    output checked bitwise against calls[reference]'s, with cuBLAS per-tensor FP8 of the same shape as the peer. The
    V4.1 experiments of sessions 18-19 shared it (exp_gemm_v41_stages.py, exp_gemm_v41_partitions.py; commit
    3bc147e)."""
    rows, one = [], torch.ones((), device="cuda")
    for M in Ms:
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            d, want = op["d"], torch.empty_like(op["d"])
            calls[reference](op, want)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K, bitwise=True)
            for variant, call in calls.items():
                d.fill_(float("nan"))
                call(op, d)
                row["bitwise"] &= bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                row[variant + "_tflops"] = tflop / ms(lambda: call(op, d)) * 1e3
            row["cublas_fp8_tensor_tflops"] = tflop / ms(lambda: torch._scaled_mm(
                op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            rows.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    return rows


def smoke(result, before_path: str) -> None:
    """Child process: ragged calls (partial row tiles, partial column blocks), every variant bitwise against the
    session-17 words."""
    calls = variants(load_before(before_path))
    out = []
    for M, N, K in ((256, 288, 640), (100, 160, 512), (300, 1280, 1280)):
        op = dense_operands(M, N, K)
        want = torch.empty_like(op["d"])
        calls["words_before"](op, want)
        for name, call in calls.items():
            op["d"].fill_(float("nan"))
            call(op, op["d"])
            torch.cuda.synchronize()
            out.append((M, N, K, name, bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16)))))
    result.put(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="session 17's gemm_gluon_fp8_kernel.py (git show 62bf345:...)")
    args = parser.parse_args()
    smoke_rows = smoke_in_child(functools.partial(smoke, before_path=args.before), SMOKE_S, "the one-MMA smoke calls")
    print("smoke, bitwise equal to session 17's words:", smoke_rows, flush=True)
    if not all(r[-1] for r in smoke_rows):
        raise SystemExit("an output differs from session 17's: not timed")
    result = environment(torch.device("cuda"))
    rows = variant_rows(variants(load_before(args.before)), "words_before", (512, 1024, 4096))
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v41_one_mma.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | words 4 MMAs | words 1 MMA | ring 4 MMAs | ring 1 MMA | words after/before "
          "| ring after/before | ring 1 MMA / words 1 MMA | best / cuBLAS | bitwise |")
    for r in rows:
        best = max(r["words_after_tflops"], r["ring_after_tflops"])
        print(f"| {r['name']} | {r['M']} | {r['words_before_tflops']:.0f} | {r['words_after_tflops']:.0f} | "
              f"{r['ring_before_tflops']:.0f} | {r['ring_after_tflops']:.0f} | "
              f"{r['words_after_tflops'] / r['words_before_tflops']:.2f} | "
              f"{r['ring_after_tflops'] / r['ring_before_tflops']:.2f} | "
              f"{r['ring_after_tflops'] / r['words_after_tflops']:.2f} | "
              f"{best / r['cublas_fp8_tensor_tflops']:.2f} | {r['bitwise']} |")


if __name__ == "__main__":
    main()
