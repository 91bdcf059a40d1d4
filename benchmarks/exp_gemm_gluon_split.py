"""Experiment (issue 4): the dense FP8 Gluon GEMMs with one consumer partition per math warpgroup, against the
shipped kernels (gemm_gluon_fp8_kernel: both math warpgroups in one partition) and cuBLAS. V3 recipe at 128 x 128
and 128 x 256 output tiles; V4.1 recipe at 128 x 128.

Why (docs/reports/deepgemm-gluon-v3.md, deepgemm-gluon-v41.md): the shipped kernels run at 0.75x (V3) and 0.49x
(V4.1) cuBLAS per-tensor FP8 (targets 1.0x and 0.85x). Their two math warpgroups are one partition, so the barrier
Gluon puts around each single-thread operation (the ring slot's wait and its release) keeps them in step: both
promote at the same time while the tensor core idles, rather than one promoting under the other's MMAs. The V4.1
kernel promotes every 32 of K, so it depends on that overlap most. And a 128 x 128 V3 tile moves 32 KB from L2 per
4 MFLOP (~6.7 TB/s of L2 traffic at 860 TFLOP/s; cuBLAS's 128 x 256 tiles need 6.7 TB/s at 1,150).
How: the package's TMA producer warp unchanged (it takes BLOCK_N from the B descriptor), and two consumer
partitions of one warpgroup each, as in the warp-specialized FP4 MoE kernel: warpgroup w owns rows [64 w, 64 w + 64)
of the 128-row tile and all its columns, arrives on the slot's "empty" barrier itself (two arrivals free a slot;
Gluon's barrier around it now spans one warpgroup), and stores its own rows.
- V3: a kernel here (`fp8_gemm_v3_split_kernel`). At BLOCK_N = 256 a warpgroup keeps two [64, 128] accumulators
  (128 registers) and runs each 128-column half as the shipped kernel runs its tile: four m64n128k32 MMAs over the
  step's K = 128 into a fresh [64, 128] tile (64 registers), wait, one FMA per element with sa[m] * sb[half]. A whole
  [64, 256] partial tile would need 128 more registers than the 232 a consumer has. Shared memory at 256 columns: a
  step is A [128, 128] + B [256, 128] = 48 KB, so 4 stages (192 KB) plus one [64, 128] bf16 store buffer per
  warpgroup (32 KB) fill the SM's 227 KB; 3 stages are timed too.
- V4.1: the package's own math partition (`_math_v41`, which takes the partition's first row, ROW0) twice, one
  warpgroup each (`fp8_gemm_v41_split_kernel`).
Numerics: every output element is the same MMA over the same K slice and the same promotion, in the same order, as
in the shipped kernels, so the outputs must be bitwise equal (checked at every shape).
Times them at bench_deepgemm's 8 dense shapes, M = 4,096 (and --m), by CUDA-graph replay, beside the shipped kernels
and torch._scaled_mm per-tensor / blockwise. Writes $OUT/exp_gemm_gluon_split.json and prints two tables.

    cd benchmarks && timeout 300 python3 exp_gemm_gluon_split.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from bench_deepgemm import DENSE_SHAPES, blockwise_scaled_mm, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring, _math_v41, _producer, _ring_barriers, _tile_offsets
from mini_deepgemm.testing import calc_diff

# (BLOCK_N, ring stages) of the split-consumer V3 kernel; the shipped kernel (128 x 128, 4 stages) is the baseline
VARIANTS = [(128, 4), (256, 4), (256, 3)]
V41_STAGES = [4, 3]  # of the split-consumer V4.1 kernel (128 x 128); the shipped one: 4
CONSUMER_REGS, PRODUCER_REGS = 232, 40
SMOKE_S = 90


@gluon.jit
def _store_half(acc, d_desc, d_smem, row, col):
    """acc (bf16) through this warpgroup's store buffer and one TMA store at (row, col); the buffer's previous
    store must have read it first."""
    tma.store_wait(pendings=0)
    d_smem.store(acc.to(d_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(d_desc, [row, col], d_smem)


@gluon.jit
def _consumer(a_ring, b_ring, ready, empty, d_desc, d_smem, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
              WG: gl.constexpr, GROUP_M: gl.constexpr):
    """One warpgroup: rows [64 WG, 64 WG + 64) of each 128-row tile, every column (one or two 128-column halves)."""
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_ring.type.shape[1]
    BLOCK_N: gl.constexpr = b_ring.type.shape[1]
    WIDE: gl.constexpr = BLOCK_N == 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    num_k = K // 128
    # The fresh partial tile of every MMA (use_acc false) is the previous MMA's output registers: passing a new
    # zero tile instead kept a second 64-register tile live at 256 columns (376 bytes of spills, offline).
    part = gl.zeros([64, 128], gl.float32, mma)
    last_sb = gl.cdiv(N, 128) - 1
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = off_m + 64 * WG
        sa_rows = sa_ptr + gl.minimum(row0 + gl.arange(0, 64, layout=rows_layout), M - 1).to(gl.int64) * stride_sa
        sb_lo = sb_ptr + (off_n // 128) * stride_sb
        sb_hi = sb_ptr + gl.minimum(off_n // 128 + 1, last_sb) * stride_sb  # past N: results not stored
        sa_next = gl.load(sa_rows)
        sb_lo_next = gl.load(sb_lo)
        sb_hi_next = gl.load(sb_hi)
        acc_lo = gl.zeros([64, 128], gl.float32, mma)
        acc_hi = gl.zeros([64, 128], gl.float32, mma)
        for k in range(num_k):
            scale_lo = sa_next * sb_lo_next
            scale_hi = sa_next * sb_hi_next
            ahead = gl.minimum(k + 1, num_k - 1)  # one step ahead, as the shipped kernel
            sa_next = gl.load(sa_rows + ahead)
            sb_lo_next = gl.load(sb_lo + ahead)
            sb_hi_next = gl.load(sb_hi + ahead)
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            a = a_ring.index(slot).slice(64 * WG, 64, dim=0)
            b = b_ring.index(slot)
            part = warpgroup_mma_wait(0, deps=(warpgroup_mma(a, b.slice(0, 128, dim=0).permute((1, 0)), part,
                                                             use_acc=False, is_async=True),))
            if WIDE:
                acc_lo += part * scale_lo[:, None]
                part = warpgroup_mma_wait(0, deps=(warpgroup_mma(a, b.slice(128, 128, dim=0).permute((1, 0)), part,
                                                                 use_acc=False, is_async=True),))
                mbarrier.arrive(empty.index(slot), count=1)
                acc_hi += part * scale_hi[:, None]
            else:
                mbarrier.arrive(empty.index(slot), count=1)
                acc_lo += part * scale_lo[:, None]
            step += 1
        _store_half(acc_lo, d_desc, d_smem, row0, off_n)
        if WIDE:
            if off_n + 128 < N:
                _store_half(acc_hi, d_desc, d_smem, row0, off_n + 128)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_gemm_v3_split_kernel(a_desc, b_desc, d_desc, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
                             STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             PRODUCER_REGS: gl.constexpr):
    """fp8_gemm_v3_kernel's math (a_desc e4m3 [M, K] in [128, 128] boxes, b_desc e4m3 [N, K] in [BLOCK_N, 128]
    boxes, BLOCK_N 128 or 256, d_desc bf16 [M, N] in [64, 128] boxes, sa fp32 [M, K / 128], sb fp32
    [N / 128, K / 128]) with one consumer partition per warpgroup. Launch: persistent grid, num_warps=4 (the first
    consumer; the second and the producer warp come from warp_specialize)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, a_desc.block_type.shape[0], BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, b_desc.block_type.shape[0], BLOCK_K], b_desc.layout)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [2, 64, 128], d_desc.layout)
    ready, empty = _ring_barriers(STAGES, 2)  # "empty": one arrival per consumer warpgroup
    gl.warp_specialize(
        [(_consumer, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(0), sa_ptr, sb_ptr, M, N, K, stride_sa,
                      stride_sb, 0, GROUP_M)),
         (_consumer, (a_ring, b_ring, ready, empty, d_desc, d_smem.index(1), sa_ptr, sb_ptr, M, N, K, stride_sa,
                      stride_sb, 1, GROUP_M)),
         (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    _invalidate_ring(ready, empty)


def split_gemm(aq, sa, bq, sb, d, block_n: int, stages: int) -> None:
    """Launches fp8_gemm_v3_split_kernel: persistent, one program per SM at most (12 warps: 168 registers each
    before setmaxnreg)."""
    M, K = aq.shape
    N = bq.shape[0]
    tiles = G.cdiv(M, 128) * G.cdiv(N, block_n)
    fp8_gemm_v3_split_kernel[(min(tiles, G.sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (block_n, 128)), G._tma_desc(d, (64, 128)), sa, sb, M, N, K,
        sa.stride(0), sb.stride(0), STAGES=stages, GROUP_M=8, CONSUMER_REGS=CONSUMER_REGS,
        PRODUCER_REGS=PRODUCER_REGS, num_warps=4, maxnreg=65536 // (12 * 32) // 8 * 8)


@gluon.jit
def fp8_gemm_v41_split_kernel(a_desc, b_desc, d_desc, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb,
                              STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              PRODUCER_REGS: gl.constexpr):
    """fp8_gemm_v41_kernel (same operands; a_desc in [128, 128] boxes, b_desc in [128, 128], d_desc in [64, 32])
    with its math partition run once per warpgroup. Launch: persistent grid, num_warps=4."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, 128, 128], a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES, 128, 128], b_desc.layout)
    d_smem0 = gl.allocate_shared_memory(d_desc.dtype, [4, 64, 32], d_desc.layout)  # each warpgroup's 4 boxes
    d_smem1 = gl.allocate_shared_memory(d_desc.dtype, [4, 64, 32], d_desc.layout)
    ready, empty = _ring_barriers(STAGES, 2)
    gl.warp_specialize(
        [(_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem0, sa_ptr, sb_ptr, M, N,
                      K, stride_sa, stride_sb, GROUP_M, 0, 4)),
         (_math_v41, (a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem1, sa_ptr, sb_ptr, M, N,
                      K, stride_sa, stride_sb, GROUP_M, 64, 4)),
         (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    _invalidate_ring(ready, empty)


def v41_split_gemm(op, d, stages: int) -> None:
    """fp8_gemm_v41_split_kernel on bench_deepgemm's V4.1 operands (UE8M0 bytes read as int32 words)."""
    (aq, sa), (bq, sb) = op["v41"]
    sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    M, K = aq.shape
    N = bq.shape[0]
    tiles = G.cdiv(M, 128) * G.cdiv(N, 128)
    fp8_gemm_v41_split_kernel[(min(tiles, G.sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (128, 128)), G._tma_desc(d, (64, 32)), sa.view(torch.int32),
        sb.view(torch.int32), M, N, K, sa.stride(0) // 4, sb.stride(0) // 4, STAGES=stages, GROUP_M=8,
        CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4, maxnreg=65536 // (12 * 32) // 8 * 8)


def v41_shipped(op, d) -> None:
    """The shipped V4.1 kernel at its M = 4,096 tile (128 x 128, 4 stages, persistent)."""
    (aq, sa), (bq, sb) = op["v41"]
    G._gluon_fp8_v41_gemm(aq, sa.view(torch.uint8), bq, sb.view(torch.uint8), d, 128, 128, 4, 1)


def shipped_config(M: int) -> dict:
    return {**G.gemm_kernel_config(G._DENSE, M, 128, False), "GLUON_BLOCK_M": 128, "GLUON_STAGES": 4,
            "GLUON_PROGRAMS_PER_SM": 1}


def smoke(result) -> None:
    """Child process: 320 x 384 x 640 (a partial 256-column tile, a lap of the 4-deep ring plus one step) per V3
    variant, then 320 x 288 x 640 per V4.1 variant, each bitwise against the shipped kernel."""
    op = dense_operands(320, 384, 640)
    a, b, d = *op["v3"], op["d"]
    want = torch.empty_like(d)
    G._gluon_fp8_v3_gemm(*a, *b, want, shipped_config(320))
    equal = []
    for block_n, stages in VARIANTS:
        d.fill_(float("nan"))
        split_gemm(*a, *b, d, block_n, stages)
        torch.cuda.synchronize()
        equal.append(bool(torch.equal(d.view(torch.int16), want.view(torch.int16))))
    op = dense_operands(320, 288, 640)  # V4.1: N not a multiple of 128 (clamped scale blocks, clipped stores)
    want = torch.empty_like(op["d"])
    v41_shipped(op, want)
    for stages in V41_STAGES:
        op["d"].fill_(float("nan"))
        v41_split_gemm(op, op["d"], stages)
        torch.cuda.synchronize()
        equal.append(bool(torch.equal(op["d"].view(torch.int16), want.view(torch.int16))))
    result.put(equal)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    equal = smoke_in_child(smoke, SMOKE_S, "the split-consumer kernels' smoke calls")
    print("smoke call, bitwise equal to the shipped kernel per variant:", equal, flush=True)
    rows, one = [], torch.ones((), device="cuda")
    for M in args.m:
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            a, b, d = *op["v3"], op["d"]
            cfg = shipped_config(M)
            want = torch.empty_like(d)
            G._gluon_fp8_v3_gemm(*a, *b, want, cfg)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K)
            row["shipped_tflops"] = tflop / ms(lambda: G._gluon_fp8_v3_gemm(*a, *b, d, cfg)) * 1e3
            for block_n, stages in VARIANTS:
                key = f"split_n{block_n}_s{stages}"
                d.fill_(float("nan"))
                split_gemm(*a, *b, d, block_n, stages)
                row[f"{key}_bitwise"] = bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                row[f"{key}_diff"] = calc_diff(d, want)
                row[f"{key}_tflops"] = tflop / ms(lambda: split_gemm(*a, *b, d, block_n, stages)) * 1e3
            row["cublas_fp8_tensor_tflops"] = tflop / ms(
                lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            blockwise = blockwise_scaled_mm(op["a"], op["b"], M, N, K)
            row["cublas_fp8_block_tflops"] = tflop / ms(blockwise) * 1e3 if blockwise else float("nan")
            v41_shipped(op, want)
            row["v41_shipped_tflops"] = tflop / ms(lambda: v41_shipped(op, d)) * 1e3
            for stages in V41_STAGES:
                key = f"v41_split_s{stages}"
                d.fill_(float("nan"))
                v41_split_gemm(op, d, stages)
                row[f"{key}_bitwise"] = bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                row[f"{key}_diff"] = calc_diff(d, want)
                row[f"{key}_tflops"] = tflop / ms(lambda: v41_split_gemm(op, d, stages)) * 1e3
            rows.append(row)
            print(name, M, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()
                            if "tflops" in k or "bitwise" in k}, flush=True)
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100", variants=VARIANTS, v41_stages=V41_STAGES,
                registers=dict(consumer=CONSUMER_REGS, producer=PRODUCER_REGS))
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_split.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    keys = [f"split_n{n}_s{s}" for n, s in VARIANTS]
    print("| shape | M | shipped | " + " | ".join(keys) + " | cuBLAS tensor | cuBLAS block | best/shipped | "
          "best/tensor | bitwise |")
    for r in rows:
        best = max(r[f"{k}_tflops"] for k in keys)
        print(f"| {r['name']} | {r['M']} | {r['shipped_tflops']:.0f} | "
              + " | ".join(f"{r[f'{k}_tflops']:.0f}" for k in keys)
              + f" | {r['cublas_fp8_tensor_tflops']:.0f} | {r['cublas_fp8_block_tflops']:.0f} | "
              f"{best / r['shipped_tflops']:.2f} | {best / r['cublas_fp8_tensor_tflops']:.2f} | "
              f"{all(r[f'{k}_bitwise'] for k in keys)} |")
    keys = [f"v41_split_s{s}" for s in V41_STAGES]
    print("| shape | M | V4.1 shipped | " + " | ".join(keys) + " | cuBLAS tensor | best/shipped | best/tensor | bitwise |")
    for r in rows:
        best = max(r[f"{k}_tflops"] for k in keys)
        print(f"| {r['name']} | {r['M']} | {r['v41_shipped_tflops']:.0f} | "
              + " | ".join(f"{r[f'{k}_tflops']:.0f}" for k in keys)
              + f" | {r['cublas_fp8_tensor_tflops']:.0f} | {best / r['v41_shipped_tflops']:.2f} | "
              f"{best / r['cublas_fp8_tensor_tflops']:.2f} | {all(r[f'{k}_bitwise'] for k in keys)} |")


if __name__ == "__main__":
    main()
