"""Experiment (issue 4): when each math warpgroup of the V4.1-recipe GEMM waits for its MMAs
(gemm_gluon_fp8_kernel.fp8_gemm_v41_kernel, 128 x 128 tiles), against the shipped kernel and cuBLAS, same run.

Why (docs/reports/deepgemm-gluon-v41.md): per 32 of K a warpgroup issues four m64n32k32 MMAs (16 tensor-core cycles
each at the SM's rate), waits for all four, then promotes each into its accumulator (one FMA per element). At ~570
TFLOP/s a 32-K block of the tile takes ~430 cycles for 128 cycles of MMAs and ~148 issue slots per sub-partition, so
the time goes to waiting, not to either pipe: each warpgroup leaves the tensor core idle from its last MMA's end
until the other warpgroup's MMAs arrive, and its own FMAs start only after the slowest of its four MMAs.
- `staggered`: the same four MMAs, then four waits that each leave the later MMAs in flight (wgmma.wait_group 3, 2,
  1, 0): block c's FMAs run while blocks c + 1..3 are still in the tensor core.
- `rolling`: within a ring step (K = 128), column block c of the next 32-K block is issued right after column block
  c of this one is promoted, so a warpgroup keeps up to four MMAs queued (its register budget holds the same four
  fresh tiles as the shipped kernel). It drains at the end of each step, where the slot is released.
Both compute every element with the same MMA and the same FMA in the same order as the shipped kernel, so their
outputs must be bitwise equal to it (checked at every shape). Session 13's `pipelined` variant (two sets of fresh
tiles, 0.79-0.98x) is the one that did not fit the registers; these keep the shipped register budget.
M = 4,096 (and --m), bench_deepgemm's 8 dense shapes, GPU time by CUDA-graph replay. Writes
$OUT/exp_gemm_gluon_v41_waits.json and prints a table.

    cd benchmarks && timeout 200 python3 exp_gemm_gluon_v41_waits.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile

import torch

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_gluon_fp8_kernel as kernel_module
from source_variants import edited_module

SMOKE_S = 120
SHIPPED_WIDE = """                    t0 = _sub_mma(a_frag, b_j, 0, zero)
                    t1 = _sub_mma(a_frag, b_j, 1, zero)
                    t2 = _sub_mma(a_frag, b_j, 2, zero)
                    t3 = _sub_mma(a_frag, b_j, 3, zero)
                    p0, p1, p2, p3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                    acc1 = _promote(acc1, p1, fa, wb1, j)
                    acc2 = _promote(acc2, p2, fa, wb2, j)
                    acc3 = _promote(acc3, p3, fa, wb3, j)
                else:
                    p0 = warpgroup_mma_wait(0, deps=(_sub_mma(a_frag, b_j, 0, zero),))
                acc0 = _promote(acc0, p0, fa, wb0, j)
"""
STAGGERED = [(SHIPPED_WIDE, """                    t0 = _sub_mma(a_frag, b_j, 0, zero)
                    t1 = _sub_mma(a_frag, b_j, 1, zero)
                    t2 = _sub_mma(a_frag, b_j, 2, zero)
                    t3 = _sub_mma(a_frag, b_j, 3, zero)
                    acc0 = _promote(acc0, warpgroup_mma_wait(3, deps=(t0,)), fa, wb0, j)
                    acc1 = _promote(acc1, warpgroup_mma_wait(2, deps=(t1,)), fa, wb1, j)
                    acc2 = _promote(acc2, warpgroup_mma_wait(1, deps=(t2,)), fa, wb2, j)
                    acc3 = _promote(acc3, warpgroup_mma_wait(0, deps=(t3,)), fa, wb3, j)
                else:
                    acc0 = _promote(acc0, warpgroup_mma_wait(0, deps=(_sub_mma(a_frag, b_j, 0, zero),)), fa, wb0, j)
""")]
# rolling: the step's first K block is issued before the loop; at K block j < 3 each column block's promotion is
# followed by that column block's MMA of K block j + 1 (wait(3): the oldest of the four queued MMAs), at j = 3 the
# four drain (wait 3, 2, 1, 0). Only the 128-column tile is rolled; the 64 x 32 decode tile keeps its one MMA.
ROLLING = [
    ("""            b_tile = b_ring.index(slot)
            for j in gl.static_range(4):
""", """            b_tile = b_ring.index(slot)
            if WIDE:
                a_frag = a_tile.slice(0, 32, dim=1).load(a_op)
                b_j = b_tile.slice(0, 32, dim=1)
                t0 = _sub_mma(a_frag, b_j, 0, zero)
                t1 = _sub_mma(a_frag, b_j, 1, zero)
                t2 = _sub_mma(a_frag, b_j, 2, zero)
                t3 = _sub_mma(a_frag, b_j, 3, zero)
                for j in gl.static_range(4):
                    fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)
                    if j < 3:
                        a_frag = a_tile.slice(32 * (j + 1), 32, dim=1).load(a_op)
                        b_j = b_tile.slice(32 * (j + 1), 32, dim=1)
                        acc0 = _promote(acc0, warpgroup_mma_wait(3, deps=(t0,)), fa, wb0, j)
                        t0 = _sub_mma(a_frag, b_j, 0, zero)
                        acc1 = _promote(acc1, warpgroup_mma_wait(3, deps=(t1,)), fa, wb1, j)
                        t1 = _sub_mma(a_frag, b_j, 1, zero)
                        acc2 = _promote(acc2, warpgroup_mma_wait(3, deps=(t2,)), fa, wb2, j)
                        t2 = _sub_mma(a_frag, b_j, 2, zero)
                        acc3 = _promote(acc3, warpgroup_mma_wait(3, deps=(t3,)), fa, wb3, j)
                        t3 = _sub_mma(a_frag, b_j, 3, zero)
                    else:
                        acc0 = _promote(acc0, warpgroup_mma_wait(3, deps=(t0,)), fa, wb0, j)
                        acc1 = _promote(acc1, warpgroup_mma_wait(2, deps=(t1,)), fa, wb1, j)
                        acc2 = _promote(acc2, warpgroup_mma_wait(1, deps=(t2,)), fa, wb2, j)
                        acc3 = _promote(acc3, warpgroup_mma_wait(0, deps=(t3,)), fa, wb3, j)
            for j in gl.static_range(4 * (1 - WIDE)):
"""),
]
EDITS = {"staggered": STAGGERED, "rolling": ROLLING}


def variant_modules(workdir: str) -> dict:
    """gemm_gluon_fp8_kernel with each of EDITS applied, by name (the shipped module under "shipped")."""
    built = {name: edited_module(kernel_module, edits, f"v41_waits_{name}", workdir) for name, edits in EDITS.items()}
    return {"shipped": kernel_module, **built}


@contextlib.contextmanager
def kernel_of(module):
    """The package's V4.1 kernel replaced by module's for the duration (gemm._gluon_fp8_v41_gemm imports it per
    call), so a call through the package's launcher runs the variant."""
    shipped = kernel_module.fp8_gemm_v41_kernel
    kernel_module.fp8_gemm_v41_kernel = module.fp8_gemm_v41_kernel
    try:
        yield
    finally:
        kernel_module.fp8_gemm_v41_kernel = shipped


def run(op, d) -> None:
    """The shipped launch of the 128 x 128 persistent tiles, whatever the tile rule would pick."""
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, 128, 128, 4, 1)


def smoke(result) -> None:
    """Child process: 256 x 288 x 640 (N not a multiple of 128, five K steps: more than a lap of the ring) and
    100 x 160 x 512 per variant, bitwise against the shipped kernel."""
    out = []
    with tempfile.TemporaryDirectory() as workdir:
        modules = variant_modules(workdir)
        for M, N, K in ((256, 288, 640), (100, 160, 512)):
            op = dense_operands(M, N, K)
            want = torch.empty_like(op["d"])
            run(op, want)
            for name, module in modules.items():
                op["d"].fill_(float("nan"))
                with kernel_of(module):
                    run(op, op["d"])
                torch.cuda.synchronize()
                out.append((M, N, K, name, bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16)))))
    result.put(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    print("smoke, bitwise equal to the shipped kernel:", smoke_in_child(smoke, SMOKE_S, "the V4.1 waits' smoke calls"),
          flush=True)
    result, rows, one = environment(torch.device("cuda")), [], torch.ones((), device="cuda")
    with tempfile.TemporaryDirectory() as workdir:
        modules = variant_modules(workdir)
        for M in args.m:
            for name, (N, K) in DENSE_SHAPES.items():
                op = dense_operands(M, N, K)
                d, want = op["d"], torch.empty_like(op["d"])
                run(op, want)
                tflop = 2 * M * N * K / 1e12
                row = dict(name=name, M=M, N=N, K=K)
                for key, module in modules.items():
                    with kernel_of(module):
                        d.fill_(float("nan"))
                        run(op, d)
                        row[f"{key}_bitwise"] = bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                        row[f"{key}_tflops"] = tflop / ms(lambda: run(op, d)) * 1e3
                row["cublas_fp8_tensor_tflops"] = tflop / ms(
                    lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
                rows.append(row)
                print(row, flush=True)
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v41_waits.json"), "w") as f:
        json.dump(result, f, indent=1)
    names = ["shipped", *EDITS]
    print("| shape | M | " + " | ".join(names) + " | cuBLAS tensor | " + " | ".join(f"{n} / shipped" for n in EDITS)
          + " | best / cuBLAS | bitwise |")
    for r in rows:
        best = max(r[f"{n}_tflops"] for n in names)
        print(f"| {r['name']} | {r['M']} | " + " | ".join(f"{r[f'{n}_tflops']:.0f}" for n in names)
              + f" | {r['cublas_fp8_tensor_tflops']:.0f} | "
              + " | ".join(f"{r[f'{n}_tflops'] / r['shipped_tflops']:.2f}" for n in EDITS)
              + f" | {best / r['cublas_fp8_tensor_tflops']:.2f} | {all(r[f'{n}_bitwise'] for n in EDITS)} |")


if __name__ == "__main__":
    main()
