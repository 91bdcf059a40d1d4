"""Experiment (issue 4, written in session 10 without a GPU left to run it): the warp-specialized V3-recipe GEMM of
gluon_v3_ws_kernel.py against the shipped Gluon kernel (gemm_gluon_fp8_kernel) and cuBLAS per-tensor FP8, GPU time
from CUDA graphs, M = 4,096, bench_deepgemm's dense shapes.

It first runs one small shape with a hard time limit in a child process (a producer/consumer mistake hangs rather
than fails), then per shape checks the output bitwise against the shipped kernel before timing. Writes
$OUT/exp_gemm_gluon_v3_ws.json.

    cd benchmarks && timeout 200 python3 exp_gemm_gluon_v3_ws.py
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import time

import torch
import triton

from bench_deepgemm import DENSE_SHAPES, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms  # GPU time from CUDA graphs, the shipped kernel's experiment's timer
from mini_deepgemm import gemm as G

PRODUCER_REGS = 40
MAXNREG = 168  # 12 warps x 32 x 168 <= 65,536: the math warpgroups get what the producer's warpgroup gives back


def launch_ws(aq, sa, bq, sb, d, stages: int = 4) -> None:
    from gluon_v3_ws_kernel import fp8_gemm_v3_ws_kernel
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, K = aq.shape
    N = bq.shape[0]

    def desc(t, block):
        return TensorDescriptor.from_tensor(t, list(block), G._nvmma_layout(block, t.dtype))

    tiles = triton.cdiv(M, 128) * triton.cdiv(N, 128)
    grid = (min(tiles, torch.cuda.get_device_properties(d.device).multi_processor_count),)
    fp8_gemm_v3_ws_kernel[grid](
        desc(aq, (128, 128)), desc(bq, (128, 128)), desc(d, (128, 128)), sa, sb, M, N, K, sa.stride(0), sb.stride(0),
        STAGES=stages, GROUP_M=8, PRODUCER_REGS=PRODUCER_REGS, num_warps=8, maxnreg=MAXNREG)


def smoke(result) -> None:
    """Child process: one 256 x 256 x 512 call (several steps per ring lap, two tiles), compared with the shipped
    kernel."""
    op = dense_operands(256, 256, 512)
    (aq, sa), (bq, sb) = op["v3"]
    want, got = torch.empty_like(op["d"]), torch.empty_like(op["d"])
    cfg = G.gemm_kernel_config(G._DENSE, 256, 128, False)
    G._gluon_fp8_v3_gemm(aq, sa, bq, sb, want, cfg)
    launch_ws(aq, sa, bq, sb, got)
    torch.cuda.synchronize()
    result.put(bool(torch.equal(got.view(torch.int16), want.view(torch.int16))))


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    child = ctx.Process(target=smoke, args=(result,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        raise SystemExit("the warp-specialized kernel did not finish a 256 x 256 x 512 call in 60 s: a hang")
    print("smoke test, bitwise equal to the shipped kernel:", result.get(), flush=True)

    rows, one = [], torch.ones((), device="cuda")
    M = 4096
    for name, (N, K) in DENSE_SHAPES.items():
        op = dense_operands(M, N, K)
        (aq, sa), (bq, sb) = op["v3"]
        d = op["d"]
        cfg = G.gemm_kernel_config(G._DENSE, M, 128, False)
        want = torch.empty_like(d)
        G._gluon_fp8_v3_gemm(aq, sa, bq, sb, want, cfg)
        launch_ws(aq, sa, bq, sb, d)
        tflop = 2 * M * N * K / 1e12
        row = dict(name=name, M=M, N=N, K=K, ws_bitwise_vs_shipped=bool(torch.equal(d.view(torch.int16),
                                                                                     want.view(torch.int16))))
        row["ws_tflops"] = tflop / ms(lambda: launch_ws(aq, sa, bq, sb, d)) * 1e3
        row["shipped_tflops"] = tflop / ms(lambda: G._gluon_fp8_v3_gemm(aq, sa, bq, sb, d, cfg)) * 1e3
        row["cublas_fp8_tensor_tflops"] = tflop / ms(
            lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
        rows.append(row)
        print(row, flush=True)
        torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100", producer_regs=PRODUCER_REGS,
                maxnreg=MAXNREG)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon_v3_ws.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
