"""Experiment (issue 4): alternatives to the shipped V4.1 Gluon GEMM's math partition (gemm_gluon_fp8_kernel.
_math_v41: per 32 of K, the A fragment in registers and four m64n32k32 MMAs, one FMA per element), timed against it
in the same run at four dense shapes (M = 4,096, 128 x 128 tiles, 4 stages, persistent):

- ss_a: the same with A read by each MMA from shared memory (no ldmatrix; four times the A reads);
- wide: one m64n128k32 MMA per 32 of K into one [BLOCK_M, 128] tile, promoted with a per-column B scale and a
  per-row A scale (two fp32 operations per element instead of one, a quarter of the MMA instructions). Written
  here (its helpers imported from the package); the package keeps one kernel unless this wins.

- pipelined (added after session 12's last GPU run, not yet measured): K block j + 1's MMAs issued before K block
  j's are waited for, so the MMA latency is exposed once per 128-wide step instead of four times.

Each variant's output is compared with the shipped kernel's (calc_diff; session 12 run 4: ss_a and wide bitwise
equal, as power-of-two scales make every multiply exact; pipelined does the same operations per element). GPU
time by CUDA-graph replay. Writes $OUT/exp_gemm_gluon_v41_variants.json.

    cd benchmarks && timeout 150 python3 exp_gemm_gluon_v41_variants.py
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

import mini_deepgemm.gemm_gluon_fp8_kernel as kernel_module
from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms
from source_variants import edited_module
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp8_kernel import (
    _allocate_ring, _invalidate_ring, _producer, _tile_offsets, _ue8m0_to_f32,
)
from mini_deepgemm.testing import calc_diff

SHAPES = ("wq_a", "wo_b", "shared_w13", "engram_wkv")
SS_A = [("a_frag = a_tile.slice(32 * j, 32, dim=1).load(a_op)", "a_frag = a_tile.slice(32 * j, 32, dim=1)")]


# pipelined: within a ring step, K block j + 1's four MMAs are issued before K block j's are waited for (wait_group
# 4 instead of 0), so a warpgroup's MMA latency is exposed once per step instead of four times; 128-column tiles only.
def shipped_step() -> str:
    """_math_v41's K-block loop, up to its MMAs' wait: the text the pipelined variant replaces."""
    source = open(kernel_module.__file__).read()
    start = source.index("            for j in gl.static_range(4):\n")
    wait = "p0, p1, p2, p3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))\n"
    return source[start:source.index(wait, start) + len(wait)]


PIPELINED_STEP = """            a_frag = a_tile.slice(0, 32, dim=1).load(a_op)
            b_j = b_tile.slice(0, 32, dim=1)
            t0 = _sub_mma(a_frag, b_j, 0, zero)
            t1 = _sub_mma(a_frag, b_j, 1, zero)
            t2 = _sub_mma(a_frag, b_j, 2, zero)
            t3 = _sub_mma(a_frag, b_j, 3, zero)
            for j in gl.static_range(4):
                fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)
                if WIDE:
                    if j < 3:
                        a_next = a_tile.slice(32 * (j + 1), 32, dim=1).load(a_op)
                        b_next = b_tile.slice(32 * (j + 1), 32, dim=1)
                        u0 = _sub_mma(a_next, b_next, 0, zero)
                        u1 = _sub_mma(a_next, b_next, 1, zero)
                        u2 = _sub_mma(a_next, b_next, 2, zero)
                        u3 = _sub_mma(a_next, b_next, 3, zero)
                        p0, p1, p2, p3 = warpgroup_mma_wait(4, deps=(t0, t1, t2, t3))
                        t0, t1, t2, t3 = u0, u1, u2, u3
                    else:
                        p0, p1, p2, p3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
"""


def source_variant(name: str, edits: list, workdir: str):
    return edited_module(kernel_module, edits, f"v41_{name}", workdir).fp8_gemm_v41_kernel


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


def launch(kernel, op, d, d_box: int, producer_regs: int = G._GLUON_V3_PRODUCER_REGS) -> None:
    (aq, sa), (bq, sb) = op["v41"]
    sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    M, K = aq.shape
    N = bq.shape[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(triton.cdiv(M, 128) * triton.cdiv(N, 128), sms),)
    kernel[grid](G._tma_desc(aq, (128, 128)), G._tma_desc(bq, (128, 128)), G._tma_desc(d, (128, d_box)),
                 sa.view(torch.int32), sb.view(torch.int32), M, N, K, sa.stride(0) // 4, sb.stride(0) // 4,
                 STAGES=4, GROUP_M=8, PRODUCER_REGS=producer_regs, num_warps=8, maxnreg=168)


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        variants = {"shipped": (kernel_module.fp8_gemm_v41_kernel, 32),
                    "ss_a": (source_variant("ss_a", SS_A, workdir), 32),
                    "pipelined": (source_variant("pipelined", [(shipped_step(), PIPELINED_STEP)], workdir), 32),
                    "wide": (wide_kernel, 128)}
        # the pipelined variant again with a 24-register producer, so the math warpgroups get 240 (offline: spill
        # stores 52 -> 12 bytes)
        variants["pipelined_p24"] = (*variants["pipelined"], 24)
        for name in SHAPES:
            N, K = DENSE_SHAPES[name]
            M = 4096
            op = dense_operands(M, N, K)
            want = torch.empty_like(op["d"])
            launch(variants["shipped"][0], op, want, 32)
            row = dict(name=name, M=M, N=N, K=K)
            for key, (kernel, box, *regs) in variants.items():
                d = torch.full_like(op["d"], float("nan"))
                launch(kernel, op, d, box, *regs)
                row[f"{key}_diff_vs_shipped"] = calc_diff(d, want)
                row[f"{key}_tflops"] = 2 * M * N * K / 1e12 / ms(lambda: launch(kernel, op, d, box, *regs)) * 1e3
            rows.append(row)
            print(row, flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                timing="triton.testing.do_bench_cudagraph median, rep 100")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v41_variants.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("| shape | shipped | ss_a | wide | pipelined | pipelined, 24-register producer |")
    for r in rows:
        print(f"| {r['name']} | {r['shipped_tflops']:.0f} | {r['ss_a_tflops']:.0f} | {r['wide_tflops']:.0f} | "
              f"{r['pipelined_tflops']:.0f} | {r['pipelined_p24_tflops']:.0f} |")


if __name__ == "__main__":
    main()
