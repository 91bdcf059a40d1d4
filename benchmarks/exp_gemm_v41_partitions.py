"""Experiment (issue 4), prepared in session 18 and not yet run on a GPU: the V4.1 kernel's 128 x 128 tiles with the
TMA producer as the default partition (both math warpgroups workers), with the A fragment from registers as shipped or
read by the MMA from shared memory.

Why (docs/reports/deepgemm-gluon-v41.md, session 18): after one MMA per K block the kernel issues 369 instructions
per warp and step but keeps the issue slots only 52% busy (ncu, wo_b at M = 4,096): each of the 2 math warps per
scheduler waits in turn on an ldmatrix of the A fragment, then its MMA. Reading A from shared memory drops the
ldmatrix and its wait. Compiled as shipped, that variant spills 68 bytes inside the loop. The spill is in the first
math warpgroup, the default partition, which ptxas compiles under the launch's 168-register cap. With the producer
as the default partition (setmaxnreg 40 there), both math warpgroups are workers at 232 registers.

Compiled offline (triton 3.6, sm_90a, ptxas), 128 x 128, 4 stages:

| variant | words: SASS per warp and step, spills | ring: SASS per step, spills |
|---|---|---|
| shipped | 481, none | 369, none |
| producer_default | 482, none | 370, none |
| producer_default_a_smem | 478, none (no LDSM) | 372, none (no LDSM) |

Measured here: whole calls at bench_deepgemm's 8 dense shapes, M = 1,024 and 4,096, both scale forms, GPU time by
CUDA-graph replay, every output bitwise against the shipped kernel's. Writes $OUT/exp_gemm_v41_partitions.json.

    cd benchmarks && timeout 300 python3 exp_gemm_v41_partitions.py
"""

from __future__ import annotations

import functools
import json
import os
import tempfile

import torch

from bench_deepgemm import dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import smoke_in_child
from exp_gemm_v41_one_mma import launch, variant_rows
from source_variants import edited_module

SMOKE_S = 150

# the two-math-warpgroup launch with the producer first (the default partition) and both math warpgroups as workers
PRODUCER_DEFAULT = (
    """        gl.warp_specialize(
            [(_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, GROUP_M, 0, SCALES_IN_RING)),
             (_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem_1, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, GROUP_M, 64, SCALES_IN_RING)),
             (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, scale_descs[0],
                          scale_descs[1], sa_ring, sb_ring, SCALES_IN_RING))],
            [4, 1], [CONSUMER_REGS, PRODUCER_REGS])""",
    """        gl.warp_specialize(
            [(_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M, scale_descs[0],
                          scale_descs[1], sa_ring, sb_ring, SCALES_IN_RING)),
             (_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, GROUP_M, 0, SCALES_IN_RING)),
             (_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, sa_ring, sb_ring, ready, empty, d_smem_1, sa_ptr,
                          sb_ptr, M, N, K, stride_sa, stride_sb, GROUP_M, 64, SCALES_IN_RING))],
            [4, 4], [CONSUMER_REGS, CONSUMER_REGS])""")
# the MMA reads A from the ring slot (shared memory) instead of an ldmatrix'd register fragment
A_FROM_SHARED = ("a_frag = a_tile.slice(32 * j, 32, dim=1).load(a_op)", "a_frag = a_tile.slice(32 * j, 32, dim=1)")


def kernel_variants(workdir: str) -> dict:
    from mini_deepgemm import gemm_gluon_fp8_kernel as shipped

    # the kernel module imports nothing relative, so its edited copies load as they are
    return {"shipped": shipped,
            "producer_default": edited_module(shipped, [PRODUCER_DEFAULT], "v41_producer_default", workdir),
            "producer_default_a_smem": edited_module(shipped, [PRODUCER_DEFAULT, A_FROM_SHARED],
                                                     "v41_producer_default_a_smem", workdir)}


def smoke(result) -> None:
    """Child process: ragged calls, every variant and scale form bitwise against the shipped kernel's words."""
    out = []
    with tempfile.TemporaryDirectory() as workdir:
        kernels = kernel_variants(workdir)
        for M, N, K in ((256, 288, 640), (100, 160, 512), (300, 1280, 1280)):
            op = dense_operands(M, N, K)
            want = torch.empty_like(op["d"])
            launch(kernels["shipped"], op, want, False, 128)
            for name, module in kernels.items():
                for ring in (False, True):
                    op["d"].fill_(float("nan"))
                    launch(module, op, op["d"], ring, 128)
                    torch.cuda.synchronize()
                    out.append((M, N, K, name, ring, bool(torch.equal(op["d"].view(torch.int16),
                                                                      want.view(torch.int16)))))
    result.put(out)


def main() -> None:
    smoke_rows = smoke_in_child(smoke, SMOKE_S, "the partition variants' smoke calls")
    print("smoke, bitwise equal to the shipped kernel:", smoke_rows, flush=True)
    if not all(r[-1] for r in smoke_rows):
        raise SystemExit("a variant's output differs from the shipped kernel's: not timed")
    result = environment(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as workdir:
        calls = {f"{name}_{'ring' if ring else 'words'}": functools.partial(launch, module, ring=ring, d_box=128)
                 for name, module in kernel_variants(workdir).items() for ring in (False, True)}
        rows = variant_rows(calls, "shipped_words", (1024, 4096))
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v41_partitions.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | form | shipped | producer_default | producer_default_a_smem | bitwise |")
    for r in rows:
        for form in ("words", "ring"):
            base = r[f"shipped_{form}_tflops"]
            print(f"| {r['name']} | {r['M']} | {form} | {base:.0f} | "
                  f"{r[f'producer_default_{form}_tflops'] / base:.2f}x | "
                  f"{r[f'producer_default_a_smem_{form}_tflops'] / base:.2f}x | {r['bitwise']} |")


if __name__ == "__main__":
    main()
