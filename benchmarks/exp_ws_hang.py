"""Session 78 experiment: which warp-specialized (triton Hopper pass) loops finish on the GPU.

Why: exp_gemm_v3_triton_ws.py's kernel compiled under triton 3.6's Hopper warp specialization (12 warps, a TMA
producer and two consumer warpgroups, offline) but hung at its first launch on an H100 (session 78 run 2). This runs,
each in its own process with a time limit, the loop in steps from a plain TMA matmul to the kernel: which step hangs
says what of the kernel the pass mishandles.

Cases (bf16 output of e4m3 [M, K] x [N, K]^T, M = N = 512, K = 1,024, bench_deepgemm.dense_operands' V3 operands (run 3
used its own random ones), checked against torch):
- dot: acc = dot(a, b^T, acc), operands by TMA;
- promoted: acc += dot(a, b^T) * 0.5 (a fresh tile promoted each step, no loads besides the TMA);
- scales_ptr: acc += dot(a, b^T) * (sa[m] * sb[n // 128]) with the scales by pointer loads (the kernel's loop);
- scales_tma: the same with both scales brought by TMA (sa^T [K/128, M] and sb expanded per column [K/128, N]);
- kernel: exp_gemm_v3_triton_ws.fp8_gemm_v3_ws_kernel, against gemm_kernel's 64 x 128 launch.
Each for BLOCK_M in (64, 128), BLOCK_N = 128, 4 warps before the pass, 3 stages.

Found (H100, run 3; its output kept the last 12 lines, without dot and promoted at 64): at BLOCK_M = 64 every case
shown finished with the expected result (the kernel bitwise equal to gemm_kernel); at 128 promoted, scales_ptr and the
kernel hung and scales_tma failed in the pass: what hangs is the pass's 128-row tile split between two consumer
warpgroups, with or without the scale loads.

Usage: python3 exp_ws_hang.py   (GPU; from benchmarks/); CASE=name BLOCK_M=m runs one case in this process
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

M = N = 512
K = 1024
CASES = ["dot", "promoted", "scales_ptr", "scales_tma", "kernel"]


@triton.jit
def ws_loop_kernel(a_desc, b_desc, sa_ptr, sb_ptr, sat_desc, sbt_desc, d_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CASE: tl.constexpr):
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.range(0, K // 128, num_stages=3, warp_specialize=True):
        a = a_desc.load([pid_m * BLOCK_M, 128 * step])
        b = b_desc.load([pid_n * BLOCK_N, 128 * step])
        if CASE == 0:
            acc = tl.dot(a, tl.trans(b), acc)
        elif CASE == 1:
            acc += tl.dot(a, tl.trans(b)) * 0.5
        elif CASE == 2:
            sa = tl.load(sa_ptr + offs_m * (K // 128) + step)
            sb = tl.load(sb_ptr + (offs_n // 128) * (K // 128) + step)
            acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
        else:
            sa = tl.reshape(sat_desc.load([step, pid_m * BLOCK_M]), [BLOCK_M])
            sb = tl.reshape(sbt_desc.load([step, pid_n * BLOCK_N]), [BLOCK_N])
            acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
    tl.store(d_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16))


def run_case(case: str, block_m: int) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    from bench_deepgemm import dense_operands

    op = dense_operands(M, N, K)
    (a, sa), (b, sb) = op["v3"]
    d = op["d"]
    if case == "kernel":
        from exp_gemm_v3_triton_ws import gemm_kernel_v3, launch

        launch((block_m, 128, 4, 3, True), a, sa, b, sb, d)
        ref = torch.empty_like(d)
        gemm_kernel_v3(a, sa, b, sb, ref)
    else:
        sat = sa.t().contiguous()  # [K/128, M]
        sbt = sb.repeat_interleave(128, dim=0)[:N].t().contiguous()  # [K/128, N]
        ws_loop_kernel[(M // block_m * (N // 128),)](
            TensorDescriptor.from_tensor(a, [block_m, 128]), TensorDescriptor.from_tensor(b, [128, 128]), sa, sb,
            TensorDescriptor.from_tensor(sat, [1, block_m]), TensorDescriptor.from_tensor(sbt, [1, 128]), d, M, N, K,
            BLOCK_M=block_m, BLOCK_N=128, CASE=CASES.index(case), num_warps=4)
        parts = (a.float().view(M, K // 128, 128), b.float().view(N, K // 128, 128))
        per_step = torch.einsum("mkc,nkc->kmn", *parts)
        if case == "dot":
            ref = per_step.sum(0)
        elif case == "promoted":
            ref = (per_step * 0.5).sum(0)
        else:
            ref = (per_step * (sa.t()[:, :, None] * sbt[:, None, :])).sum(0)
        ref = ref.bfloat16()
    torch.cuda.synchronize()
    err = ((d.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"{case} BLOCK_M {block_m}: finished, relative L2 error {err:.2e}", flush=True)


def main() -> None:
    for case in CASES:
        for block_m in (64, 128):
            try:
                done = subprocess.run([sys.executable, __file__], env={**os.environ, "CASE": case,
                                                                        "BLOCK_M": str(block_m)},
                                      capture_output=True, text=True, timeout=25)
                out = (done.stdout.strip().splitlines() or [f"exit {done.returncode}: {done.stderr[-300:]}"])[-1]
            except subprocess.TimeoutExpired:
                out = f"{case} BLOCK_M {block_m}: HUNG (no exit within 25 s)"
            print(out, flush=True)


if __name__ == "__main__":
    run_case(os.environ["CASE"], int(os.environ["BLOCK_M"])) if "CASE" in os.environ else main()
