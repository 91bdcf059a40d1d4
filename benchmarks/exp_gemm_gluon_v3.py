"""Experiment (issue 4): the Gluon dense FP8 GEMM of the V3 recipe (gemm_gluon_fp8_kernel: a TMA producer warp and
one partition per math warpgroup, FP8 wgmma promoted per 128 of K, 128 x 128 or 128 x 256 tiles) against
gemm_kernel's Triton version and cuBLAS, same run. (Session 14 measured the per-warpgroup partitions and the
256-column tiles against the earlier single math partition with benchmarks/exp_gemm_gluon_split.py of commit
e8911ae; docs/reports/deepgemm-gluon-v3.md.)

It first runs one small call with a hard time limit in a child process (a producer/consumer mistake in the kernel
hangs rather than fails). Then for each dense shape of bench_deepgemm.py at M = 4,096 (and 16,384 with --m): checks
the Gluon output against the Triton kernel's (bitwise equal or calc_diff), then times the Gluon kernel (launched
directly, whatever the routing decides) in each of VARIANTS (tile, ring stages, store buffers, K steps in pairs), the
Triton kernel at its shipped tile, torch._scaled_mm per-tensor and 1x128 / 128x128 blockwise (cuBLAS). Writes
$OUT/exp_gemm_gluon_v3.json and prints a table. profile_call is profile_ncu.py's case for one variant.

    cd benchmarks && timeout 150 python3 exp_gemm_gluon_v3.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time

import torch
import triton
import triton.testing

from bench_deepgemm import DENSE_SHAPES, blockwise_scaled_mm, dense_operands  # beside this script
from mini_deepgemm import gemm as G
from mini_deepgemm.testing import calc_diff

# (BLOCK_M, BLOCK_N, ring stages, persistent programs per SM; 0 = one program per tile, store buffers per math
# warpgroup, K steps in pairs with two MMAs in flight). Session 10 timed the single-partition kernel of then also at
# one program per tile (a tie when persistent) and with two MMAs in flight (slower); session 11 run 1 the
# warp-specialized kernel; session 14 the partition per math warpgroup; session 63 a second store buffer for
# 256-column tiles (which fits at 3 stages) and 64-row tiles (one math warpgroup, two programs per SM); session 64
# the MMAs issued in turns by the two math warpgroups (commit 4d9cd4c; 0.97-0.995x), then 128-column tiles with K
# steps in pairs, the second MMA in flight while the first is promoted (run 2 also at 6 stages: 0.95-1.04x the 4).
VARIANTS = [(128, 128, 4, 1, 1, 0), (128, 128, 4, 1, 1, 1), (128, 256, 4, 1, 1, 0), (128, 256, 3, 1, 2, 0)]
SMOKE_S = 60


def variant_config(block_m: int, block_n: int, stages: int, per_sm: int, bufs: int, pairs: int) -> dict:
    return {"GLUON_BLOCK_M": block_m, "GLUON_BLOCK_N": block_n, "GLUON_STAGES": stages,
            "GLUON_PROGRAMS_PER_SM": per_sm, "GLUON_STORE_BUFS": bufs, "GLUON_PAIRS": bool(pairs)}


def variant_key(block_m: int, block_n: int, stages: int, per_sm: int, bufs: int, pairs: int) -> str:
    return f"gluon_{block_m}x{block_n}_s{stages}_p{per_sm}_b{bufs}" + ("_pairs" if pairs else "")


def ms(fn) -> float:
    """GPU time per call: calls replayed from a CUDA graph, so host launch cost (the Gluon path builds three TMA
    descriptors per call) does not leak into the small shapes (run 8: Triton's own wkv figure moved 624 -> 238
    TFLOP/s between runs under do_bench)."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001 - a column measured with host time is better than none; said so
        print("cuda graph timing failed, host-inclusive do_bench instead:", repr(e)[:200], flush=True)
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def smoke(result) -> None:
    """Child process: one 256 x 256 x 512 call per variant (tiles of 4 K steps: a lap of the ring), bitwise against
    the Triton kernel."""
    op = dense_operands(256, 256, 512)
    a, b, d = *op["v3"], op["d"]
    base = G.gemm_kernel_config(G._DENSE, 256, 128, False)
    want = torch.empty_like(d)
    G._gemm(G._DENSE, a, b, want, None, None, None, False, config={**base, "GLUON": False})
    equal = []
    for variant in VARIANTS:
        G._gluon_fp8_v3_gemm(*a, *b, d, {**base, **variant_config(*variant)})
        torch.cuda.synchronize()
        equal.append(bool(torch.equal(d.view(torch.int16), want.view(torch.int16))))
    result.put(equal)


def smoke_in_child(target, seconds: float, what: str):
    """Runs target(queue) in a spawned child with a time limit (a warp-specialized kernel's handover mistake hangs
    rather than fails); exits the experiment if it hangs or fails, else returns what the child put."""
    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    child = ctx.Process(target=target, args=(result,))
    child.start()
    child.join(seconds)
    if child.is_alive():
        child.kill()
        raise SystemExit(f"{what} did not finish in {seconds} s: a hang")
    if child.exitcode != 0:
        raise SystemExit(f"{what} failed (exit code {child.exitcode})")
    return result.get()


def smoke_or_exit() -> None:
    equal = smoke_in_child(smoke, SMOKE_S, "the Gluon V3 kernel's 256 x 256 x 512 smoke call")
    print("smoke call, bitwise equal to the Triton kernel per variant:", equal, flush=True)


def profile_call(variant: str):
    """profile_ncu.py's MODULE:FACTORY:ARG case: wo_b (N 5,120, K 8,192) at M = 4,096 in VARIANTS[int(variant)]."""
    M, N, K = 4096, *DENSE_SHAPES["wo_b"]
    op = dense_operands(M, N, K)
    cfg = {**G.gemm_kernel_config(G._DENSE, M, 128, False), **variant_config(*VARIANTS[int(variant)])}
    return lambda: G._gluon_fp8_v3_gemm(*op["v3"][0], *op["v3"][1], op["d"], cfg)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="*", default=[4096])
    args = p.parse_args()
    smoke_or_exit()
    rows, one = [], torch.ones((), device="cuda")
    for M in args.m:
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            a, b, d = *op["v3"], op["d"]
            base = G.gemm_kernel_config(G._DENSE, M, 128, False)
            triton_cfg = {**base, "GLUON": False}
            want = torch.empty_like(d)
            G._gemm(G._DENSE, a, b, want, None, None, None, False, config=triton_cfg)
            tflop = 2 * M * N * K / 1e12
            row = dict(name=name, M=M, N=N, K=K)
            for variant in VARIANTS:
                cfg = {**base, **variant_config(*variant)}
                G._gluon_fp8_v3_gemm(*a, *b, d, cfg)
                key = variant_key(*variant)
                row[f"{key}_bitwise_vs_triton"] = bool(torch.equal(d.view(torch.int16), want.view(torch.int16)))
                row[f"{key}_diff_vs_triton"] = calc_diff(d, want)
                row[f"{key}_tflops"] = tflop / ms(lambda: G._gluon_fp8_v3_gemm(*a, *b, d, cfg)) * 1e3
            row["triton_tflops"] = tflop / ms(lambda: G._gemm(G._DENSE, a, b, d, None, None, None, False,
                                                              config=triton_cfg)) * 1e3
            row["cublas_fp8_tensor_tflops"] = tflop / ms(
                lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            blockwise = blockwise_scaled_mm(op["a"], op["b"], M, N, K)
            row["cublas_fp8_block_tflops"] = tflop / ms(blockwise) * 1e3 if blockwise else float("nan")
            rows.append(row)
            print(name, M, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items() if "tflops" in k},
                  "bitwise:", [row[f"{variant_key(*v)}_bitwise_vs_triton"] for v in VARIANTS],
                  flush=True)
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100", variants=VARIANTS)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "exp_gemm_gluon_v3.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    keys = [variant_key(*v) for v in VARIANTS]
    print("| shape | M | " + " | ".join(keys) + " | Triton | cuBLAS tensor | cuBLAS block | best/tensor |")
    for r in rows:
        best = max(r[f"{k}_tflops"] for k in keys)
        peers = f"{r['triton_tflops']:.0f} | {r['cublas_fp8_tensor_tflops']:.0f} | {r['cublas_fp8_block_tflops']:.0f}"
        print(f"| {r['name']} | {r['M']} | " + " | ".join(f"{r[f'{k}_tflops']:.0f}" for k in keys)
              + f" | {peers} | {best / r['cublas_fp8_tensor_tflops']:.2f} |")


if __name__ == "__main__":
    main()
