"""Experiment (issue 4): two variants of the shipped V3-recipe Gluon GEMM (gemm_gluon_fp8_kernel.fp8_gemm_v3_kernel,
one partition per math warpgroup, 128 x 256 tiles where they fill the waves), against it and cuBLAS, same run.

Why (docs/reports/deepgemm-gluon-v3.md, session 14): the kernel reached 0.88x cuBLAS per-tensor FP8. Counting shared
memory traffic per SM and K step of a 128 x 256 tile: each warpgroup's MMAs read its A rows twice (once per
128-column half, 2 x 8 KB) and all of B (32 KB), and TMA writes the step's 48 KB. That is 144 KB per ~1,024
tensor-core cycles, against ~128 B per cycle of shared-memory bandwidth. The tile is close to that bound even
before anything else stalls it.
- `a_regs`: each warpgroup loads its A rows once per step into registers (16 per thread, ldmatrix) and both halves'
  MMAs take A from registers, so A is read from shared memory once per step instead of twice (-11% of the traffic
  above, +16 registers: 208 of 232).
- `group16`: the shipped kernel with 16 row tiles per L2 sweep instead of 8 (more B reuse from L2 per sweep).
Both compute every element with the same MMAs in the same order (A's values are the same bytes wherever they come
from), so the outputs must be bitwise equal to the shipped kernel's (checked at every shape).
M = 4,096 (and --m), bench_deepgemm's 8 dense shapes, GPU time by CUDA-graph replay. Writes
$OUT/exp_gemm_gluon_v3_variants.json and prints a table.

    cd benchmarks && timeout 200 python3 exp_gemm_gluon_v3_variants.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_gluon_fp8_kernel as kernel_module
from source_variants import edited_module
from bench_flashmla import environment

SMOKE_S = 90
A_REGS = [
    ("    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)\n    num_k = K // 128\n    last_sb",
     "    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)\n"
     "    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)\n    num_k = K // 128\n"
     "    last_sb"),
    ("            a = a_ring.index(slot).slice(ROW0, 64, dim=0)\n",
     "            a = a_ring.index(slot).slice(ROW0, 64, dim=0).load(a_op)\n"),
]


def launch(kernel, aq, sa, bq, sb, d, group_m: int = 8, block_n: int | None = None) -> None:
    """kernel (fp8_gemm_v3_kernel or a variant) at session 14's shipped launch: 128 rows, the routed columns (or
    block_n), 4 stages, one persistent program per SM, one K step at a time (the kernel's default; the package takes
    128-column tiles' steps in pairs since session 64)."""
    M, K = aq.shape
    N = bq.shape[0]
    block_n = block_n or G._gluon_v3_block_n(M, N, K, 128, d.device)
    grid, maxnreg = G._dense_gluon_launch(G.cdiv(M, 128) * G.cdiv(N, block_n), 128, 1, d.device)
    kernel[grid](G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (block_n, 128)), G._tma_desc(d, (64, 128)), sa, sb,
                 M, N, K, sa.stride(0), sb.stride(0), STAGES=4, GROUP_M=group_m,
                 CONSUMER_REGS=G._GLUON_CONSUMER_REGS, PRODUCER_REGS=G._GLUON_PRODUCER_REGS, num_warps=4,
                 maxnreg=maxnreg)


def variants(workdir: str) -> dict:
    a_regs = edited_module(kernel_module, A_REGS, "v3_a_regs", workdir).fp8_gemm_v3_kernel
    shipped = kernel_module.fp8_gemm_v3_kernel
    return {"shipped": lambda *t: launch(shipped, *t), "a_regs": lambda *t: launch(a_regs, *t),
            "group16": lambda *t: launch(shipped, *t, group_m=16)}


def smoke(result) -> None:
    """Child process: 320 x 1,280 x 640 (128 x 256 tiles, a partial row tile, more steps than the ring) per
    variant, bitwise against the shipped kernel."""
    with tempfile.TemporaryDirectory() as workdir:
        calls = variants(workdir)
        op = dense_operands(320, 1280, 640)
        (a, b), want = op["v3"], torch.empty_like(op["d"])
        calls["shipped"](*a, *b, want)
        equal = []
        for name, call in calls.items():
            op["d"].fill_(float("nan"))
            call(*a, *b, op["d"])
            torch.cuda.synchronize()
            equal.append((name, bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16)))))
        result.put(equal)


def measure(calls: dict, row_counts: list[int]) -> list[dict]:
    """Per M in row_counts and bench_deepgemm dense shape: every call's TFLOP/s and whether its output is bitwise the
    "shipped" call's, and cuBLAS per-tensor FP8's TFLOP/s; calls: name -> fn(aq, sa, bq, sb, d) (`launch`)."""
    rows, one = [], torch.ones((), device="cuda")
    for M in row_counts:
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            (a, b), d = op["v3"], op["d"]
            want = torch.empty_like(d)
            calls["shipped"](*a, *b, want)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K, block_n=G._gluon_v3_block_n(M, N, K, 128, d.device))
            for key, call in calls.items():
                d.fill_(float("nan"))
                call(*a, *b, d)
                row[f"{key}_bitwise"] = bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                row[f"{key}_tflops"] = tflop / ms(lambda: call(*a, *b, d)) * 1e3
            row["cublas_fp8_tensor_tflops"] = tflop / ms(
                lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    print("smoke, bitwise equal to the shipped kernel:", smoke_in_child(smoke, SMOKE_S, "the V3 variants' smoke call"),
          flush=True)
    result = environment(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as workdir:
        rows = result["rows"] = measure(variants(workdir), args.m)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v3_variants.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | columns | shipped | a_regs | group16 | cuBLAS tensor | a_regs / shipped | group16 / shipped | "
          "bitwise |")
    for r in rows:
        print(f"| {r['name']} | {r['M']} | {r['block_n']} | {r['shipped_tflops']:.0f} | {r['a_regs_tflops']:.0f} | "
              f"{r['group16_tflops']:.0f} | {r['cublas_fp8_tensor_tflops']:.0f} | "
              f"{r['a_regs_tflops'] / r['shipped_tflops']:.2f} | {r['group16_tflops'] / r['shipped_tflops']:.2f} | "
              f"{r['a_regs_bitwise'] and r['group16_bitwise']} |")


if __name__ == "__main__":
    main()
