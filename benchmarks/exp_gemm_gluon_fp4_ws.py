"""Experiment (issue 4): the grouped FP8 x FP4 GEMM (MoE prefill, contiguous layout) on a warp-specialized Gluon
kernel, against the shipped one (gemm_gluon_kernel.fp4_grouped_gemm_kernel), same run. Written in session 12, after
its last GPU run: not yet run.

Why: the shipped kernel (one warpgroup per CTA, 128 weight rows x 128 tokens, two CTAs per SM, cp.async ring)
runs 373-390 TFLOP/s on bf16 MMAs, 0.70-0.75x cuBLAS's bf16 grouped GEMM (session 12 run 4); each CTA loads its
own copy of the activation tile and issues its own copies. Here (same math, so bitwise equal output is expected):
- one CTA per SM, persistent, 256 weight rows x 128 tokens per tile, the activation tile shared by two consumer
  warpgroups (half the activation bytes per FLOP);
- a producer warp issues every copy by TMA (two [128, 32] bf16 halves of the activations in the FP4 K order, the
  [256, 32] packed weight bytes) into a STAGES-deep ring with "ready" (expect-tx) and "empty" (one arrival per
  consumer warpgroup) mbarriers;
- each consumer warpgroup is a partition of its own (so its mbarrier arrive waits for its own 4 warps only and the
  two warpgroups drift apart: one converts while the other's MMAs run, as the shipped kernel's two CTAs do); it
  converts its 128 weight rows in the wgmma A-operand layout with the shipped kernel's inline PTX, issues the same
  two m64n128k16 MMA chains (even, odd), and loads its rows' scale words from global memory a step ahead.
The same kernel takes the masked layout (MoE decode; 16- or 32-token tiles as the shipped masked kernel, deeper
rings: weights streamed at 0.25-0.39 of a device copy today, target 0.6).
Checks: bitwise against the shipped kernel on the MoE shapes (both layouts), padding / unused rows untouched, and a
small case against the pure-torch reference. Times both kernels alone (the activation pass excluded; same x), and
torch._scaled_grouped_mm.
A hang guard runs first (child process). Writes $OUT/exp_gemm_gluon_fp4_ws.json.

    cd benchmarks && timeout 240 python3 exp_gemm_gluon_fp4_ws.py
"""

from __future__ import annotations

import json
import os
import platform

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from bench_deepgemm import copy_bandwidth_gbs  # beside this script
from exp_gemm_gluon import contiguous_operands
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp8_kernel import _tile_offsets
from mini_deepgemm.gemm_gluon_kernel import weights_of_step
from mini_deepgemm.testing import calc_diff

ROUTINGS = {"96x128-1024": 96, "192x128-1024": 192}
SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}
CONSUMER_REGS, PRODUCER_REGS = 232, 40
SMOKE_S = 120


@gluon.jit
def _tile(tile, group_ptr, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
          MASKED: gl.constexpr):
    """(off_m, off_n, group, x_row, rows_in_group, has_rows) of tile `tile`, the same for every partition.
    Contiguous: tiles over [M, N] in grouped order; the group is the layout's id of the tile's first row (-1:
    padding only). Masked: group-major, [M = max_m, N] per group; rows_in_group = masked_m[group]."""
    if MASKED:
        per_group = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
        group = tile // per_group
        off_m, off_n = _tile_offsets(tile % per_group, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows_in_group = gl.load(group_ptr + group)
        x_row = group * M + off_m
        has_rows = off_m < rows_in_group
    else:
        off_m, off_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        group = gl.load(group_ptr + off_m)
        rows_in_group = M
        x_row = off_m
        has_rows = group >= 0
    return off_m, off_n, group, x_row, rows_in_group, has_rows


@gluon.jit
def _producer(x_desc, w_desc, x_ring, w_ring, ready, empty, group_ptr, num_groups, M, N, K, BLOCK_N: gl.constexpr,
              GROUP_M: gl.constexpr, MASKED: gl.constexpr):
    """One warp: every K step (64 values) of this program's tiles that hold rows, in order, into ring slot
    step % STAGES once both consumer warpgroups have released it."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    steps = K // 64
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * num_groups
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n, group, x_row, rows_in_group, has_rows = _tile(tile, group_ptr, M, N, BLOCK_M, BLOCK_N,
                                                                    GROUP_M, MASKED)
        if has_rows:
            w_row = group * N + off_n
            for i in range(steps):
                slot = step % STAGES
                mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
                bar = ready.index(slot)
                mbarrier.expect(bar, 2 * x_desc.block_type.nbytes + w_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(x_desc, [x_row, 64 * i], bar, x_ring.index(2 * slot))
                tma.async_copy_global_to_shared(x_desc, [x_row, 64 * i + 32], bar, x_ring.index(2 * slot + 1))
                tma.async_copy_global_to_shared(w_desc, [w_row, 32 * i], bar, w_ring.index(slot))
                step += 1


@gluon.jit
def _consumer(x_ring, w_ring, ready, empty, sw_ptr, d_ptr, group_ptr, num_groups, M, N, K, stride_sw_g, stride_sw_n,
              stride_d_g, stride_d, HALF: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
              MASKED: gl.constexpr):
    """One warpgroup: weight rows [HALF * 128, HALF * 128 + 128) of each tile, gemm_gluon_kernel's step on them."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    ROWS: gl.constexpr = BLOCK_N // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_a: gl.constexpr = gl.SliceLayout(1, a_layout)
    cols_a: gl.constexpr = gl.SliceLayout(0, a_layout)
    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [16, 2], [1, 4], [0, 1])
    second = (gl.arange(0, 32, cols_a) >= 16)[None, :]  # bytes 16..31 hold values 32..63: the block's 2nd scale
    steps = K // 64
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * num_groups
    step = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n, group, x_row, rows_in_group, has_rows = _tile(tile, group_ptr, M, N, BLOCK_M, BLOCK_N,
                                                                    GROUP_M, MASKED)
        if has_rows:
            n0 = off_n + HALF * ROWS
            rows = n0 + gl.arange(0, ROWS, rows_a)
            sw_rows = (sw_ptr + group.to(gl.int64) * stride_sw_g).to(gl.pointer_type(gl.int32)) \
                + gl.minimum(rows, N - 1).to(gl.int64) * (stride_sw_n // 4)
            word = gl.load(sw_rows)
            acc = gl.zeros([ROWS, BLOCK_M], gl.float32, mma)
            for i in range(steps):
                slot = step % STAGES
                # step i + 1's word (one word holds two steps' scales), loaded a step early
                ahead = gl.load(sw_rows + gl.minimum(i + 1, steps - 1) // 2)
                mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
                packed = w_ring.index(slot).slice(HALF * ROWS, ROWS, dim=0).load(a_layout)
                w_even, w_odd = weights_of_step(packed, word, i, second)
                tok = warpgroup_mma(w_even, x_ring.index(2 * slot).permute((1, 0)), acc, is_async=True)
                tok = warpgroup_mma(w_odd, x_ring.index(2 * slot + 1).permute((1, 0)), tok, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[tok])
                mbarrier.arrive(empty.index(slot), count=1)  # this warpgroup is done with the slot
                word = ahead
                step += 1
            out = gl.convert_layout(acc.to(gl.bfloat16), out_layout)
            offs_n = n0 + gl.arange(0, ROWS, gl.SliceLayout(1, out_layout))
            offs_m = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, out_layout))
            if MASKED:
                row_ok = offs_m < rows_in_group
                d_tile = d_ptr + group.to(gl.int64) * stride_d_g
            else:
                row_ok = gl.load(group_ptr + offs_m, mask=offs_m < M, other=-1) == group
                d_tile = d_ptr
            mask = row_ok[None, :] & (offs_n < N)[:, None]
            gl.store(d_tile + offs_m.to(gl.int64)[None, :] * stride_d + offs_n[:, None], out, mask=mask)


@gluon.jit
def fp4_grouped_ws_kernel(x_desc, w_desc, sw_ptr, d_ptr, group_ptr, num_groups, M, N, K, stride_sw_g, stride_sw_n,
                          stride_d_g, stride_d, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                          MASKED: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    """d[m, n] = sum_k x[m, k] * dequant(w[group(m)])[n, k]. x bf16 in the FP4 K order by x_desc in [BLOCK_M, 32]
    boxes; w packed e2m1 as uint8 [G * N, K / 2] by w_desc in [BLOCK_N, 32] boxes; sw UE8M0 [G, N, K / 32] (read as
    int32 words; strides in bytes); d bf16. Contiguous (MASKED false): x [M, K], d [M, N], group_ptr the int32 layout
    [M] (-1 = padding, segments BLOCK_M-aligned), num_groups 1. Masked: x [G * M, K] (M = max_m), d [G, M, N],
    group_ptr masked_m int32 [G], num_groups G. Launch: num_warps=4 (the first consumer warpgroup), persistent."""
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, x_desc.block_type.shape[0], 32], x_desc.layout)
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, 32], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one arrival per consumer warpgroup
    gl.warp_specialize(
        [(_consumer, (x_ring, w_ring, ready, empty, sw_ptr, d_ptr, group_ptr, num_groups, M, N, K, stride_sw_g,
                      stride_sw_n, stride_d_g, stride_d, 0, BLOCK_N, GROUP_M, MASKED)),
         (_consumer, (x_ring, w_ring, ready, empty, sw_ptr, d_ptr, group_ptr, num_groups, M, N, K, stride_sw_g,
                      stride_sw_n, stride_d_g, stride_d, 1, BLOCK_N, GROUP_M, MASKED)),
         (_producer, (x_desc, w_desc, x_ring, w_ring, ready, empty, group_ptr, num_groups, M, N, K, BLOCK_N,
                      GROUP_M, MASKED))],
        [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


def ws_gemm(x, bq, sb, d, group_arg, stages: int = 4, block_m: int = 128) -> None:
    """The experimental kernel. Contiguous: x bf16 [M, K] from G._dequant_activations (FP4 K order), d [M, N],
    group_arg the layout. Masked: x [G, max_m, K] from G._dequant_masked_rows, d [G, max_m, N], group_arg masked_m.
    bq uint8 [G, N, K/2], sb uint8 [G, N, K/32] (4-byte aligned rows)."""
    masked = x.dim() == 3
    Gn, N, K2 = bq.shape
    M, K = x.shape[-2:]
    block_n = 256
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n) * (Gn if masked else 1)
    grid = (min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count),)
    w_desc = TensorDescriptor.from_tensor(bq.view(Gn * N, K2), [block_n, 32],
                                          gl.NVMMASharedLayout.get_default_for([block_n, 32], gl.uint8))
    # 12 warps resident (4 + 4 consumers, the producer's warpgroup): 168 registers at launch, then setmaxnreg
    fp4_grouped_ws_kernel[grid](
        G._tma_desc(x.reshape(-1, K), (block_m, 32)), w_desc, sb, d, group_arg, Gn if masked else 1, M, N, K,
        sb.stride(0), sb.stride(1), d.stride(0) if masked else 0, d.stride(-2), BLOCK_N=block_n, STAGES=stages,
        GROUP_M=8, MASKED=masked, CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4,
        maxnreg=168)


def shipped_gemm(x, bq, sb, d, layout) -> None:
    G._gluon_fp4_grouped_gemm(G._CONTIGUOUS, x, bq, sb, d, layout,
                              {"BLOCK_M": 128, "BLOCK_N": 128, "GLUON_STAGES": 3, "GROUP_M": 8})


def smoke(result) -> None:
    """Child process: 3 experts with 77, 0 and 300 rows, N 512, K 512 (more steps than stages), against the
    shipped kernel (bitwise) and the reference; padding rows untouched."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, sa, bq, sb, x, layout, _ = contiguous_operands([77, 0, 300], 512, 512, gen)
    d = torch.zeros(layout.numel(), 512, dtype=torch.bfloat16, device="cuda")
    ws_gemm(x, bq, sb, d, layout)
    want = torch.zeros_like(d)
    shipped_gemm(x, bq, sb, want, layout)
    ref = torch.zeros(layout.numel(), 512, dtype=torch.bfloat16)
    G.m_grouped_fp8_fp4_gemm_nt_contiguous((a.cpu(), sa.cpu()), (bq.cpu(), sb.cpu()), ref, layout.cpu())
    real = layout >= 0
    result.put(dict(bitwise_vs_shipped=bool(torch.equal(d, want)), padding_untouched=bool((d[~real] == 0).all()),
                    diff_vs_reference=calc_diff(d[real].float(), ref.cuda()[real].float())))


def main() -> None:
    print("smoke:", smoke_in_child(smoke, SMOKE_S, "the warp-specialized FP4 kernel's smoke call"), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu = torch.Generator().manual_seed(0)
    rows_out = []
    for routing, groups in ROUTINGS.items():
        rows = torch.randint(128, 1025, (groups,), generator=cpu).tolist()
        for name, (N, K) in SHAPES.items():
            a, sa, bq, sb, x, layout, ends = contiguous_operands(rows, N, K, gen)
            real = layout >= 0
            flops = 2 * sum(rows) * N * K
            want = torch.zeros(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
            shipped_gemm(x, bq, sb, want, layout)
            row = dict(routing=routing, name=name, N=N, K=K, rows=sum(rows))
            for stages in (3, 4):
                d = torch.zeros_like(want)
                ws_gemm(x, bq, sb, d, layout, stages)
                row[f"ws_s{stages}_bitwise_vs_shipped"] = bool(torch.equal(d[real], want[real]))
                row[f"ws_s{stages}_padding_untouched"] = bool((d[~real] == 0).all())
                row[f"ws_s{stages}_tflops"] = flops / ms(lambda: ws_gemm(x, bq, sb, d, layout, stages)) / 1e9
            row["shipped_tflops"] = flops / ms(lambda: shipped_gemm(x, bq, sb, want, layout)) / 1e9
            w8 = torch.randn(len(rows), N, K, device="cuda").to(torch.float8_e4m3fn)
            s_a, s_b = torch.rand(layout.numel(), device="cuda") + 0.5, torch.rand(len(rows), N, device="cuda") + 0.5
            row["scaled_grouped_mm_fp8_tflops"] = flops / ms(lambda: torch._scaled_grouped_mm(
                a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)) / 1e9
            rows_out.append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    copy_gbs = copy_bandwidth_gbs()
    for expected_m in (8, 32):
        for name, (N, K) in SHAPES.items():
            rows_out.append(masked_case(name, N, K, expected_m, copy_gbs, gen, cpu))
            print(rows_out[-1], flush=True)
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), timing="triton.testing.do_bench_cudagraph median")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_fp4_ws.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows_out), f, indent=1)
    print("| routing | shape | shipped | WS 3 stages | WS 4 stages | scaled_grouped_mm FP8 | bitwise |")
    for r in rows_out:
        if "expected_m" in r:
            continue
        print(f"| {r['routing']} | {r['name']} | {r['shipped_tflops']:.0f} | {r['ws_s3_tflops']:.0f} | "
              f"{r['ws_s4_tflops']:.0f} | {r['scaled_grouped_mm_fp8_tflops']:.0f} | "
              f"{r['ws_s3_bitwise_vs_shipped'] and r['ws_s4_bitwise_vs_shipped']} |")
    print("| masked shape | expected_m | shipped GB/s | WS 6 stages | WS 10 stages | copy GB/s | best / copy | "
          "bitwise |")
    for r in rows_out:
        if "expected_m" not in r:
            continue
        best = max(r["ws_s6_gbs"], r["ws_s10_gbs"])
        bitwise = r["ws_s6_bitwise_vs_shipped"] and r["ws_s10_bitwise_vs_shipped"]
        print(f"| {r['name']} | {r['expected_m']} | {r['shipped_gbs']:.0f} | {r['ws_s6_gbs']:.0f} | "
              f"{r['ws_s10_gbs']:.0f} | {r['copy_gbs']:.0f} | {best / r['copy_gbs']:.2f} | {bitwise} |")


def masked_case(name, N, K, expected_m, copy_gbs, gen, cpu) -> dict:
    """bench_deepgemm.py's masked decode case (96 experts, max 128 rows, Poisson(expected_m) rows, at least 1) on
    the activations of the shipped path's pass: both kernels alone, weight bytes / time against the device copy."""
    Gn, max_m = 96, 128
    masked_m = torch.clamp(torch.poisson(torch.full((Gn,), float(expected_m)), generator=cpu), 1, max_m).int().cuda()
    a = torch.randn(Gn, max_m, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa = torch.randint(120, 130, (Gn, max_m, K // 32), device="cuda", dtype=torch.uint8, generator=gen)
    bq = torch.randint(0, 256, (Gn, N, K // 2), dtype=torch.uint8, device="cuda", generator=gen)
    sb = torch.randint(118, 126, (Gn, N, K // 32), dtype=torch.uint8, device="cuda", generator=gen)
    x = G._dequant_masked_rows(a, sa, masked_m)
    cfg = G.default_config(G._MASKED, expected_m, 32, True, N, Gn, True)
    want = torch.zeros(Gn, max_m, N, dtype=torch.bfloat16, device="cuda")
    G._gluon_fp4_grouped_gemm(G._MASKED, x, bq, sb, want, masked_m, cfg)
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    weight_bytes = bq.numel() + sb.numel()
    row = dict(name=name, N=N, K=K, expected_m=expected_m, rows=int(masked_m.sum()), block_m=cfg["BLOCK_M"],
               copy_gbs=copy_gbs)
    row["shipped_gbs"] = weight_bytes / ms(lambda: G._gluon_fp4_grouped_gemm(G._MASKED, x, bq, sb, want, masked_m,
                                                                               cfg)) / 1e6
    for stages in (6, 10):
        d = torch.zeros_like(want)
        ws_gemm(x, bq, sb, d, masked_m, stages, cfg["BLOCK_M"])
        row[f"ws_s{stages}_bitwise_vs_shipped"] = bool(torch.equal(d[used], want[used]))
        row[f"ws_s{stages}_unused_rows_untouched"] = bool((d[~used] == 0).all())
        row[f"ws_s{stages}_gbs"] = weight_bytes / ms(lambda: ws_gemm(x, bq, sb, d, masked_m, stages,
                                                                      cfg["BLOCK_M"])) / 1e6
    return row


if __name__ == "__main__":
    main()
