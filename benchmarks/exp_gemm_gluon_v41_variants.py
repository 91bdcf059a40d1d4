"""Experiment (issue 4): two alternatives to the shipped V4.1 Gluon GEMM's math partition (gemm_gluon_fp8_kernel.
_math_v41: per 32 of K, the A fragment in registers and four m64n32k32 MMAs, one FMA per element), timed against it
in the same run at four dense shapes (M = 4,096, 128 x 128 tiles, 4 stages, persistent):

- ss_a: the same with A read by each MMA from shared memory (no ldmatrix; four times the A reads);
- wide: one m64n128k32 MMA per 32 of K into one [BLOCK_M, 128] tile, promoted with a per-column B scale and a
  per-row A scale (two fp32 operations per element instead of one, a quarter of the MMA instructions). Written
  here (its helpers imported from the package); the package keeps one kernel unless this wins.

Each variant's output is compared with the shipped kernel's (calc_diff; the wide one sums in another order per
element: not bitwise). GPU time by CUDA-graph replay. Writes $OUT/exp_gemm_gluon_v41_variants.json.

    cd benchmarks && timeout 150 python3 exp_gemm_gluon_v41_variants.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import tempfile

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

import mini_deepgemm.gemm_gluon_fp8_kernel as kernel_module
from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp8_kernel import (
    _allocate_ring, _invalidate_ring, _producer, _tile_offsets, _ue8m0_to_f32,
)
from mini_deepgemm.testing import calc_diff

SHAPES = ("wq_a", "wo_b", "shared_w13", "engram_wkv")
SS_A = [(re.compile(r"a_frag = a_tile.slice\(32 \* j, 32, dim=1\).load\(a_op\)"),
         "a_frag = a_tile.slice(32 * j, 32, dim=1)")]


def ss_a_kernel(workdir: str):
    source = open(kernel_module.__file__).read()
    for pattern, replacement in SS_A:
        source, n = pattern.subn(replacement, source)
        assert n == 1, pattern.pattern
    path = os.path.join(workdir, "v41_ss_a.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("v41_ss_a", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.fp8_gemm_v41_kernel


@gluon.jit
def _math_wide(a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem, sa_ptr, sb_ptr, M, N, K, stride_sa,
               stride_sb, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    STAGES: gl.constexpr = a_ring.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    rows_layout: gl.constexpr = gl.SliceLayout(1, mma)
    cols_layout: gl.constexpr = gl.SliceLayout(0, mma)
    num_k = K // BLOCK_K
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    last_nb = (N - 1) // 32
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
    block_of_col = gl.arange(0, BLOCK_N, layout=cols_layout) // 32
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = off_m + gl.arange(0, BLOCK_M, layout=rows_layout)
        sa_rows = sa_ptr + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_sa
        nb = off_n // 32
        sb0 = sb_ptr + nb * stride_sb
        sb1 = sb_ptr + gl.minimum(nb + 1, last_nb) * stride_sb
        sb2 = sb_ptr + gl.minimum(nb + 2, last_nb) * stride_sb
        sb3 = sb_ptr + gl.minimum(nb + 3, last_nb) * stride_sb
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
        for k in range(num_k):
            slot = step % STAGES
            wa = gl.load(sa_rows + k)
            wb0, wb1, wb2, wb3 = gl.load(sb0 + k), gl.load(sb1 + k), gl.load(sb2 + k), gl.load(sb3 + k)
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            a_tile = a_ring.index(slot)
            b_tile = b_ring.index(slot)
            for j in gl.static_range(4):
                t = warpgroup_mma(a_tile.slice(32 * j, 32, dim=1), b_tile.slice(32 * j, 32, dim=1).permute((1, 0)),
                                  zero, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(0, deps=(t,))
                fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)
                f0 = _ue8m0_to_f32((wb0 >> (8 * j)) & 0xFF)
                f1 = _ue8m0_to_f32((wb1 >> (8 * j)) & 0xFF)
                f2 = _ue8m0_to_f32((wb2 >> (8 * j)) & 0xFF)
                f3 = _ue8m0_to_f32((wb3 >> (8 * j)) & 0xFF)
                fb = gl.where(block_of_col == 0, f0,
                              gl.where(block_of_col == 1, f1, gl.where(block_of_col == 2, f2, f3)))
                acc += (part * fb[None, :]) * fa[:, None]
            mbarrier.arrive(empty.index(slot), count=1)
            step += 1
        tma.store_wait(pendings=0)
        d_smem.store(acc.to(d_desc.dtype))
        kernel_module.fence_async_shared()
        tma.async_copy_shared_to_global(d_desc, [off_m, off_n], d_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def wide_kernel(a_desc, b_desc, d_desc, sa_ptr, sb_ptr, M, N, K, stride_sa, stride_sb, STAGES: gl.constexpr,
                GROUP_M: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    a_ring, b_ring, ready, empty = _allocate_ring(a_desc, b_desc, STAGES)
    d_smem = gl.allocate_shared_memory(d_desc.dtype, [a_desc.block_type.shape[0], b_desc.block_type.shape[0]],
                                       d_desc.layout)
    gl.warp_specialize(
        [(_math_wide, (a_desc, b_desc, d_desc, a_ring, b_ring, ready, empty, d_smem, sa_ptr, sb_ptr, M, N, K,
                       stride_sa, stride_sb, GROUP_M, num_warps)),
         (_producer, (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, GROUP_M))],
        [1], [PRODUCER_REGS])
    _invalidate_ring(ready, empty)


def launch(kernel, op, d, d_box: int) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    M, K = aq.shape
    N = bq.shape[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(triton.cdiv(M, 128) * triton.cdiv(N, 128), sms),)
    kernel[grid](G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (128, 128)), G._tma_desc(d, (128, d_box)),
                 sa.view(torch.int32), sb.view(torch.int32), M, N, K, sa.stride(0) // 4, sb.stride(0) // 4,
                 STAGES=4, GROUP_M=8, PRODUCER_REGS=G._GLUON_V3_PRODUCER_REGS, num_warps=8, maxnreg=168)


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        variants = {"shipped": (kernel_module.fp8_gemm_v41_kernel, 32), "ss_a": (ss_a_kernel(workdir), 32),
                    "wide": (wide_kernel, 128)}
        for name in SHAPES:
            N, K = DENSE_SHAPES[name]
            M = 4096
            op = dense_operands(M, N, K)
            want = torch.empty_like(op["d"])
            launch(*variants["shipped"][:1], op, want, 32)
            row = dict(name=name, M=M, N=N, K=K)
            for key, (kernel, box) in variants.items():
                d = torch.full_like(op["d"], float("nan"))
                launch(kernel, op, d, box)
                row[f"{key}_diff_vs_shipped"] = calc_diff(d, want)
                row[f"{key}_tflops"] = 2 * M * N * K / 1e12 / ms(lambda: launch(kernel, op, d, box)) * 1e3
            rows.append(row)
            print(row, flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                timing="triton.testing.do_bench_cudagraph median, rep 100")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v41_variants.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("| shape | shipped | ss_a | wide |")
    for r in rows:
        print(f"| {r['name']} | {r['shipped_tflops']:.0f} | {r['ss_a_tflops']:.0f} | {r['wide_tflops']:.0f} |")


if __name__ == "__main__":
    main()
