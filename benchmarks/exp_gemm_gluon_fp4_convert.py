"""Experiment (issue 4): the contiguous FP8 x FP4 MoE GEMM with its weight conversion in a warpgroup of its own.
Written in session 13 after its last GPU run: not yet run.

Why: in the shipped warp-specialized kernel (gemm_gluon_kernel.fp4_contiguous_ws_kernel, 473-488 TFLOP/s, 0.6 of
cuBLAS's dense bf16 rate) each consumer warpgroup converts its 128 weight rows (e2m1 -> bf16, scale folded in) and
then issues its MMAs from registers, so a consumer's MMAs wait for its own conversion, and the conversion is paid
per 128-token tile. Session 13 run 5 hints that conversion is the larger part: at ~64 rows per expert, 64-token
tiles (the same conversion, half the MMAs per tile, 1.5 tiles per expert) ran 191-196 TFLOP/s against 263-267 for
128-token tiles.
How (this kernel): four partitions on one persistent CTA per SM, tile 256 weight rows x 128 tokens as shipped:
- the shipped TMA producer warp (`_ws_producer`: packed weights and the two activation halves into a ring slot);
- a converter warpgroup: waits for a slot, converts its 256 x 64 weights with the shipped inline PTX into two bf16
  tiles (even / odd values, [256, 32] each, 32 KB) in shared memory, fences, and signals "converted";
- two consumer warpgroups, 128 weight rows each: wait for "converted", issue the same two m64n128k16 MMAs with A
  read from shared memory instead of registers, wait, release the slot.
The consumers then only issue MMAs, and the conversion overlaps them. The products, the MMA shape and the K order
are unchanged, so the output must be bitwise equal to the shipped kernel's. Costs: 32 KB more shared memory per
stage (3 stages: 168 KB), and A read from shared memory by the tensor cores.
Checks: a smoke call in a child process (a handover mistake hangs), bitwise equality with the shipped kernel on
the MoE shapes (and padding rows untouched), then GPU time of both at bench_deepgemm's routings and at ~64 rows per
expert. Writes $OUT/exp_gemm_gluon_fp4_convert.json.

    cd benchmarks && timeout 240 python3 exp_gemm_gluon_fp4_convert.py
"""

from __future__ import annotations

import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                warpgroup_mma_wait)

from exp_gemm_gluon import contiguous_operands
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp8_kernel import _invalidate_ring, _ring_barriers
from mini_deepgemm.gemm_gluon_kernel import _ws_producer, _ws_tile, scale_word_rows, weights_of_step

ROUTINGS = {"96x128-1024": (96, 128, 1025), "192x128-1024": (192, 128, 1025), "384x32-96": (384, 32, 97)}
SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}
# 16 warps resident (the producer warp's partition is padded to a warpgroup): 128 registers each at launch, then
# setmaxnreg: 8 x 32 x 176 + 4 x 32 x 120 + 4 x 32 x 40 = 64K. Offline (triton 3.6, ptxas sm_90a): no spills,
# 176 KB of shared memory at 3 stages.
CONSUMER_REGS, CONVERTER_REGS, PRODUCER_REGS = 176, 120, 40
SMOKE_S = 120


@gluon.jit
def _converter(w_ring, conv_ring, ready, converted, sw_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n,
               BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr):
    """One warpgroup: per K step of each tile with rows, the slot's [256, 32] packed bytes -> bf16 even and odd
    values times their scales (gemm_gluon_kernel.weights_of_step) in conv_ring slots 2 * slot and 2 * slot + 1."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_N: gl.constexpr = w_ring.type.shape[1]
    # each thread: 2 rows x 32 bytes in two 16-byte runs (4 consecutive bytes per asm call)
    bytes_layout: gl.constexpr = gl.BlockedLayout([2, 16], [32, 1], [4, 1], [1, 0])
    second = (gl.arange(0, 32, gl.SliceLayout(0, bytes_layout)) >= 16)[None, :]  # bytes 16..31: the 2nd scale
    steps = K // 64
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n, group = _ws_tile(tile, layout_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if group >= 0:
            rows = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, bytes_layout))
            sw_rows = scale_word_rows(sw_ptr, group, rows, N, stride_sw_g, stride_sw_n)
            word = gl.load(sw_rows)
            for i in range(steps):
                slot = step % STAGES
                ahead = gl.load(sw_rows + gl.minimum(i + 1, steps - 1) // 2)  # one word holds two steps' scales
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                packed = w_ring.index(slot).load(bytes_layout)
                w_even, w_odd = weights_of_step(packed, word, i, second)
                conv_ring.index(2 * slot).store(w_even)
                conv_ring.index(2 * slot + 1).store(w_odd)
                fence_async_shared()  # the consumers' wgmmas read these through the async proxy
                mbarrier.arrive(converted.index(slot), count=1)
                word = ahead
                step += 1


@gluon.jit
def _mma_consumer(x_ring, conv_ring, ready, converted, empty, d_ptr, layout_ptr, M, N, K, stride_d,
                  HALF: gl.constexpr, GROUP_M: gl.constexpr):
    """One warpgroup: weight rows [HALF * 128, HALF * 128 + 128) of each tile, both MMAs with A from conv_ring."""
    STAGES: gl.constexpr = x_ring.type.shape[0] // 2
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    BLOCK_N: gl.constexpr = conv_ring.type.shape[1]
    ROWS: gl.constexpr = BLOCK_N // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, 4], [0, 1])  # n fastest: d rows n-contiguous
    steps = K // 64
    step = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N), gl.num_programs(0)):
        off_m, off_n, group = _ws_tile(tile, layout_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if group >= 0:
            acc = gl.zeros([ROWS, BLOCK_M], gl.float32, mma)
            for i in range(steps):
                slot = step % STAGES
                phase = (step // STAGES) & 1
                mbarrier.wait(ready.index(slot), phase)  # the activations (TMA), seen directly
                mbarrier.wait(converted.index(slot), phase)
                w_even = conv_ring.index(2 * slot).slice(HALF * ROWS, ROWS, dim=0)
                w_odd = conv_ring.index(2 * slot + 1).slice(HALF * ROWS, ROWS, dim=0)
                tok = warpgroup_mma(w_even, x_ring.index(2 * slot).permute((1, 0)), acc, is_async=True)
                tok = warpgroup_mma(w_odd, x_ring.index(2 * slot + 1).permute((1, 0)), tok, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[tok])
                mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup is done with the slot
                step += 1
            out = gl.convert_layout(acc.to(gl.bfloat16), out_layout)
            offs_n = off_n + HALF * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, out_layout))
            offs_m = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, out_layout))
            row_ok = gl.load(layout_ptr + offs_m, mask=offs_m < M, other=-1) == group
            mask = row_ok[None, :] & (offs_n < N)[:, None]
            gl.store(d_ptr + offs_m.to(gl.int64)[None, :] * stride_d + offs_n[:, None], out, mask=mask)


@gluon.jit
def fp4_contiguous_convert_kernel(x_desc, w_desc, sw_ptr, d_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n,
                                  stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                  CONVERTER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """fp4_contiguous_ws_kernel's contract (same operands, descriptors and output) with the conversion in its own
    warpgroup. Launch: persistent grid of at most one program per SM, num_warps=4 (the first consumer)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    conv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 32], gl.bfloat16)
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, BLOCK_M, 32], x_desc.layout)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 32], w_desc.layout)
    conv_ring = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BLOCK_N, 32], conv_layout)
    ready, empty = _ring_barriers(STAGES, 2)  # "empty": one arrival per consumer warpgroup
    converted = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(converted.index(s), count=1)
    gl.warp_specialize(
        [(_mma_consumer, (x_ring, conv_ring, ready, converted, empty, d_ptr, layout_ptr, M, N, K, stride_d, 0,
                          GROUP_M)),
         (_mma_consumer, (x_ring, conv_ring, ready, converted, empty, d_ptr, layout_ptr, M, N, K, stride_d, 1,
                          GROUP_M)),
         (_converter, (w_ring, conv_ring, ready, converted, sw_ptr, layout_ptr, M, N, K, stride_sw_g, stride_sw_n,
                       BLOCK_M, GROUP_M)),
         (_ws_producer, (x_desc, w_desc, x_ring, w_ring, ready, empty, layout_ptr, M, N, K, GROUP_M))],
        [4, 4, 1], [CONSUMER_REGS, CONVERTER_REGS, PRODUCER_REGS])
    _invalidate_ring(ready, empty)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(converted.index(s))


def convert_gemm(x, bq, sb, d, layout, stages: int = 3) -> None:
    """The experimental kernel, launched as gemm._gluon_fp4_contiguous_ws_gemm launches the shipped one."""
    Gn, N, K2 = bq.shape
    M, K = x.shape
    tiles = triton.cdiv(M, 128) * triton.cdiv(N, 256)
    fp4_contiguous_convert_kernel[(min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count),)](
        G._tma_desc(x, (128, 32)), G._tma_desc(bq.view(Gn * N, K2), (256, 32)), sb, d, layout, M, N, K,
        sb.stride(0), sb.stride(1), d.stride(0), STAGES=stages, GROUP_M=8, CONSUMER_REGS=CONSUMER_REGS,
        CONVERTER_REGS=CONVERTER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4,
        maxnreg=65536 // (16 * 32))


def shipped_gemm(x, bq, sb, d, layout) -> None:
    G._gluon_fp4_contiguous_ws_gemm(x, bq, sb, d, layout, 4)


def smoke(result) -> None:
    """Child process: 3 experts with 77, 0 and 300 rows, N 512, K 512 (more steps than stages), against the
    shipped kernel (bitwise); padding rows untouched."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, sa, bq, sb, x, layout, _ = contiguous_operands([77, 0, 300], 512, 512, gen)
    d = torch.zeros(layout.numel(), 512, dtype=torch.bfloat16, device="cuda")
    convert_gemm(x, bq, sb, d, layout)
    want = torch.zeros_like(d)
    shipped_gemm(x, bq, sb, want, layout)
    real = layout >= 0
    result.put(dict(bitwise_vs_shipped=bool(torch.equal(d, want)), padding_untouched=bool((d[~real] == 0).all())))


def main() -> None:
    print("smoke:", smoke_in_child(smoke, SMOKE_S, "the converter-warpgroup FP4 kernel's smoke call"), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu = torch.Generator().manual_seed(0)
    rows_out = []
    for routing, (groups, low, high) in ROUTINGS.items():
        rows = torch.randint(low, high, (groups,), generator=cpu).tolist()
        for name, (N, K) in SHAPES.items():
            _, _, bq, sb, x, layout, _ = contiguous_operands(rows, N, K, gen)
            real = layout >= 0
            flops = 2 * sum(rows) * N * K
            want = torch.zeros(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
            shipped_gemm(x, bq, sb, want, layout)
            row = dict(routing=routing, name=name, N=N, K=K, rows=sum(rows))
            row["shipped_tflops"] = flops / ms(lambda: shipped_gemm(x, bq, sb, want, layout)) / 1e9
            for stages in (2, 3):
                d = torch.zeros_like(want)
                convert_gemm(x, bq, sb, d, layout, stages)
                row[f"convert_s{stages}_bitwise"] = bool(torch.equal(d[real], want[real]))
                row[f"convert_s{stages}_padding_untouched"] = bool((d[~real] == 0).all())
                row[f"convert_s{stages}_tflops"] = flops / ms(lambda: convert_gemm(x, bq, sb, d, layout, stages)) / 1e9
            rows_out.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_fp4_convert.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       timing="do_bench_cudagraph median", rows=rows_out), f, indent=1)
    print("| routing | shape | shipped WS | converter WG, 2 stages | 3 stages | bitwise |")
    for r in rows_out:
        print(f"| {r['routing']} | {r['name']} | {r['shipped_tflops']:.0f} | {r['convert_s2_tflops']:.0f} | "
              f"{r['convert_s3_tflops']:.0f} | {r['convert_s2_bitwise'] and r['convert_s3_bitwise']} |")


if __name__ == "__main__":
    main()
