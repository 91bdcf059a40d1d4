"""Experiment (issue 4, session 22): the V3-recipe Gluon GEMM (gemm_gluon_fp8_kernel._math_v3) with each K step's
MMAs issued as 64-column chunks, two in flight, each chunk promoted while the next one runs.

Why: the shipped warpgroup issues one m64n128k128 MMA chain per 128-column half, waits for all of it (wait 0), then
promotes (acc += part * sa * sb): during that FMA its own tensor-core work is empty and only the other warpgroup's
MMAs keep the SM busy. The kernel is at 0.87x cuBLAS per-tensor FP8 (deepgemm-gluon-v3.md), which applies no scales.
A second fresh [64, 128] tile to promote one half under the next would need 64 registers more than a warpgroup has.
How (`chunks`): the same registers cut finer. Two fresh [64, 64] tiles (p0, p1) take turns: issue chunk c + 1 before
waiting for chunk c alone (warpgroup_mma_wait(1)), promote chunk c, issue chunk c + 2 into its registers, ... A
128-column tile is two chunks per step, a 256-column tile four; the accumulators are [64, 64] quarters (same
registers as two halves). The session 21 contiguous MoE kernel does the same with two chunks (branch
contiguous-mma-halves). Cost: A is read from shared memory once per 64 columns instead of once per 128 (+32 KB per
step of a 128 x 256 tile over 144 KB).
Every output element is the same 128-deep MMA chain and the same promotion, so the outputs must be bitwise equal to
the shipped kernel's (checked at every shape), at the routed columns and at 128 (`*_n128`). Offline (triton 3.6,
sm_90a): no spills at 128 columns; 132 bytes at 256, where the compiler issues the third chunk's MMA into fresh
registers before the first chunk's FMAs (three fresh tiles live). M = 4,096 (and --m), bench_deepgemm's 8 dense
shapes, GPU time by CUDA-graph replay, cuBLAS per-tensor FP8 in the same run. Writes $OUT/exp_gemm_v3_mma_chunks.json.

    cd benchmarks && timeout 200 python3 exp_gemm_v3_mma_chunks.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile

import torch

from bench_deepgemm import dense_operands  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import smoke_in_child
from exp_gemm_gluon_v3_variants import launch, measure
from mini_deepgemm import gemm_gluon_fp8_kernel as kernel_module
from source_variants import edited_module

SMOKE_S = 90
# _math_v3's whole body, replaced: from its definition up to the kernel that calls it
MATH_V3 = re.compile(r"@gluon\.jit\ndef _math_v3\(.*?(?=@gluon\.jit\ndef fp8_gemm_v3_kernel)", re.S)
CHUNKED_MATH_V3 = '''@gluon.jit
def _store_chunks(acc0, acc1, d_desc, d_smem, off_m, off_n):
    """_store_tile of a [64, 128] tile held as two [64, 64] chunks."""
    tma.store_wait(pendings=0)
    d_smem.slice(0, 64, dim=1).store(acc0.to(d_desc.dtype))
    d_smem.slice(64, 64, dim=1).store(acc1.to(d_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(d_desc, [off_m, off_n], d_smem)


@gluon.jit
def _math_v3(a_ring, b_ring, ready, empty, d_desc, d_smem, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
             ROW0: gl.constexpr, GROUP_M: gl.constexpr):
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    BLOCK_N: gl.constexpr = b_ring.type.shape[1]
    WIDE: gl.constexpr = BLOCK_N == 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 32])
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // 128
    last_sb = gl.cdiv(N, 128) - 1
    p0 = gl.zeros([64, 64], gl.float32, mma)
    p1 = gl.zeros([64, 64], gl.float32, mma)
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = off_m + ROW0
        sa_rows = sa_ptr + gl.minimum(row0 + gl.arange(0, 64, layout=rows_layout), M - 1).to(gl.int64) * stride_sa
        sb_lo = sb_ptr + (off_n // 128) * stride_sb
        sb_hi = sb_ptr + gl.minimum(off_n // 128 + 1, last_sb) * stride_sb
        sa_next, sb_lo_next, sb_hi_next = gl.load(sa_rows), gl.load(sb_lo), gl.load(sb_hi)
        acc0 = gl.zeros([64, 64], gl.float32, mma)
        acc1 = gl.zeros([64, 64], gl.float32, mma)
        acc2 = gl.zeros([64, 64], gl.float32, mma)
        acc3 = gl.zeros([64, 64], gl.float32, mma)
        for k in range(num_k):
            scale_lo = sa_next * sb_lo_next
            scale_hi = sa_next * sb_hi_next
            ahead = gl.minimum(k + 1, num_k - 1)
            sa_next, sb_lo_next, sb_hi_next = gl.load(sa_rows + ahead), gl.load(sb_lo + ahead), gl.load(sb_hi + ahead)
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            a = a_ring.index(slot).slice(ROW0, 64, dim=0)
            b = b_ring.index(slot)
            t0 = warpgroup_mma(a, b.slice(0, 64, dim=0).permute((1, 0)), p0, use_acc=False, is_async=True)
            t1 = warpgroup_mma(a, b.slice(64, 64, dim=0).permute((1, 0)), p1, use_acc=False, is_async=True)
            p0 = warpgroup_mma_wait(1, deps=(t0,))
            acc0 += p0 * scale_lo[:, None]
            if WIDE:
                t0 = warpgroup_mma(a, b.slice(128, 64, dim=0).permute((1, 0)), p0, use_acc=False, is_async=True)
                p1 = warpgroup_mma_wait(1, deps=(t1,))
                acc1 += p1 * scale_lo[:, None]
                t1 = warpgroup_mma(a, b.slice(192, 64, dim=0).permute((1, 0)), p1, use_acc=False, is_async=True)
                p0 = warpgroup_mma_wait(1, deps=(t0,))
                acc2 += p0 * scale_hi[:, None]
                p1 = warpgroup_mma_wait(0, deps=(t1,))
                mbarrier.arrive(empty.index(slot), count=1)
                acc3 += p1 * scale_hi[:, None]
            else:
                p1 = warpgroup_mma_wait(0, deps=(t1,))
                mbarrier.arrive(empty.index(slot), count=1)
                acc1 += p1 * scale_lo[:, None]
            step += 1
        _store_chunks(acc0, acc1, d_desc, d_smem, row0, off_n)
        if WIDE:
            if off_n + 128 < N:
                _store_chunks(acc2, acc3, d_desc, d_smem, row0, off_n + 128)
    tma.store_wait(pendings=0)


'''


def variants(workdir: str) -> dict:
    chunked = edited_module(kernel_module, [(MATH_V3, lambda _: CHUNKED_MATH_V3)], "v3_mma_chunks",
                            workdir).fp8_gemm_v3_kernel
    shipped = kernel_module.fp8_gemm_v3_kernel
    return {"shipped": lambda *t: launch(shipped, *t), "chunks": lambda *t: launch(chunked, *t),
            "shipped_n128": lambda *t: launch(shipped, *t, block_n=128),
            "chunks_n128": lambda *t: launch(chunked, *t, block_n=128)}


def smoke(result) -> None:
    """Child process: 320 x 1,280 x 640 (128 x 256 tiles, a partial row tile, more steps than the ring) and
    320 x 384 x 640 (128-column tiles), bitwise against the shipped kernel."""
    with tempfile.TemporaryDirectory() as workdir:
        calls = variants(workdir)
        equal = []
        for N in (1280, 384):
            op = dense_operands(320, N, 640)
            (a, b), want = op["v3"], torch.empty_like(op["d"])
            calls["shipped"](*a, *b, want)
            for name in ("chunks", "chunks_n128"):
                op["d"].fill_(float("nan"))
                calls[name](*a, *b, op["d"])
                torch.cuda.synchronize()
                equal.append((N, name, bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16)))))
        result.put(equal)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    print("smoke, bitwise equal to the shipped kernel:", smoke_in_child(smoke, SMOKE_S, "the chunked V3 smoke call"),
          flush=True)
    result = environment(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as workdir:
        rows = result["rows"] = measure(variants(workdir), args.m)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v3_mma_chunks.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| shape | M | columns | shipped | chunks | shipped, 128 columns | chunks, 128 columns | cuBLAS tensor | "
          "chunks / shipped | best / cuBLAS | bitwise |")
    for r in rows:
        best = max(r[f"{v}_tflops"] for v in ("shipped", "chunks", "shipped_n128", "chunks_n128"))
        print(f"| {r['name']} | {r['M']} | {r['block_n']} | {r['shipped_tflops']:.0f} | {r['chunks_tflops']:.0f} | "
              f"{r['shipped_n128_tflops']:.0f} | {r['chunks_n128_tflops']:.0f} | {r['cublas_fp8_tensor_tflops']:.0f} | "
              f"{r['chunks_tflops'] / r['shipped_tflops']:.2f} | {best / r['cublas_fp8_tensor_tflops']:.2f} | "
              f"{r['chunks_bitwise'] and r['chunks_n128_bitwise']} |")


if __name__ == "__main__":
    main()
