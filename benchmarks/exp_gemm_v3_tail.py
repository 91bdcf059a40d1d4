"""Experiment (issue 4, session 28): the V3 Gluon kernel's last wave split into column halves, and the tile width
chosen by the wave count (gemm._gluon_v3_tiles), against the rule before (256 columns where 128 x 256 tiles fill 85%
of their last wave, nothing split) and cuBLAS, same process.

Why: a persistent launch of T tiles on P programs takes ceil(T / P) tile times. At M = 4,096, wq_a's 320 tiles of
128 x 128 on 132 SMs take 3 (2.42 of work) and shared_w13's 576 tiles of 128 x 256 take 5 (4.36). Split into halves,
a last wave of r <= P / 2 tiles takes half a tile time.

Per dense shape of bench_deepgemm.py at M = 4,096 and 16,384: the output of both rules, bitwise compared; the GPU
time of both (CUDA-graph replay, median), of torch._scaled_mm per-tensor and 1x128 / 128x128 blockwise (cuBLAS);
the tiles each rule picked. (wkv at M = 4,096, 128 tiles, is timed on the Gluon kernel here; the
API routes it to gemm_kernel, _use_gluon_v3.) Runs a small call per configuration in a child process first (a handover mistake in a
warp-specialized kernel hangs rather than fails). Writes $OUT/exp_gemm_v3_tail.json and prints a table.

    cd benchmarks && timeout 200 python3 exp_gemm_v3_tail.py
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch
import triton

from bench_deepgemm import DENSE_SHAPES, blockwise_scaled_mm, dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms, smoke_in_child
from mini_deepgemm import gemm as G
from mini_deepgemm._backend import cdiv, sm_count


def rule_before(M: int, N: int) -> dict:
    """The launch config of the rule before session 28 (gemm._gluon_v3_block_n of 1bcb043): 256 columns where the
    128 x 256 tiles fill 85% of their last wave, every tile whole."""
    sms = sm_count(torch.device("cuda"))
    tiles = cdiv(M, 128) * cdiv(N, 256)
    block_n = 256 if tiles >= 0.85 * cdiv(tiles, sms) * sms else 128
    return {"GLUON_BLOCK_N": block_n, "GLUON_FULL_TILES": cdiv(M, 128) * cdiv(N, block_n)}


def configs(M: int, N: int) -> dict:
    base = G.gemm_kernel_config(G._DENSE, M, 128, False)
    return {"before": {**base, **rule_before(M, N)}, "split": base}


def smoke(result) -> None:
    """Child process: wq_a at M = 4,096 (the split's case: 264 whole tiles, 112 halves) under both rules, and every
    tile split at 128 and 256 columns on a small call."""
    equal = []
    for M, N, K, extra in ((4096, 1280, 5120, None), (256, 520, 512, 0)):
        op = dense_operands(M, N, K)
        a, b, d = *op["v3"], op["d"]
        outs = []
        for cfg in configs(M, N).values():
            if extra is not None:
                cfg = {**cfg, "GLUON_FULL_TILES": extra}
            G._gluon_fp8_v3_gemm(*a, *b, d, cfg)
            torch.cuda.synchronize()
            outs.append(d.clone())
        equal.append(bool(torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))))
    result.put(equal)


def main() -> None:
    print("smoke calls, bitwise equal across the rules:", smoke_in_child(smoke, 120, "the V3 tail smoke calls"),
          flush=True)
    one, rows = torch.ones((), device="cuda"), []
    programs = sm_count(torch.device("cuda"))
    for M in (4096, 16384):
        for name, (N, K) in DENSE_SHAPES.items():
            op = dense_operands(M, N, K)
            a, b, d = *op["v3"], op["d"]
            tflop = 2 * M * N * K / 1e12
            block_n, full = G._gluon_v3_tiles(M, N, 128, programs)
            row = dict(name=name, M=M, N=N, K=K, before_block_n=rule_before(M, N)["GLUON_BLOCK_N"],
                       split_block_n=block_n, split_full_tiles=full, tiles=cdiv(M, 128) * cdiv(N, block_n))
            outs = {}
            for key, cfg in configs(M, N).items():
                G._gluon_fp8_v3_gemm(*a, *b, d, cfg)
                outs[key] = d.clone()
                row[f"{key}_tflops"] = tflop / ms(lambda: G._gluon_fp8_v3_gemm(*a, *b, d, cfg)) * 1e3
            row["bitwise_equal"] = bool(torch.equal(outs["before"].view(torch.int16), outs["split"].view(torch.int16)))
            row["cublas_fp8_tensor_tflops"] = tflop / ms(
                lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)) * 1e3
            blockwise = blockwise_scaled_mm(op["a"], op["b"], M, N, K)
            row["cublas_fp8_block_tflops"] = tflop / ms(blockwise) * 1e3 if blockwise else float("nan")
            rows.append(row)
            print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v3_tail.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("| shape | M | before (cols) | split (cols, whole tiles / tiles) | split / before | cuBLAS tensor | "
          "cuBLAS block | before / tensor | split / tensor | bitwise |")
    for r in rows:
        tensor = r["cublas_fp8_tensor_tflops"]
        print(f"| {r['name']} | {r['M']} | {r['before_tflops']:.0f} ({r['before_block_n']}) | {r['split_tflops']:.0f} "
              f"({r['split_block_n']}, {r['split_full_tiles']} / {r['tiles']}) | "
              f"{r['split_tflops'] / r['before_tflops']:.3f} | {tensor:.0f} | {r['cublas_fp8_block_tflops']:.0f} | "
              f"{r['before_tflops'] / tensor:.3f} | {r['split_tflops'] / tensor:.3f} | {r['bitwise_equal']} |")
    for M in (4096, 16384):
        sub = [r for r in rows if r["M"] == M]
        for key in ("before", "split"):
            ratios = [r[f"{key}_tflops"] / r["cublas_fp8_tensor_tflops"] for r in sub]
            block = [r[f"{key}_tflops"] / r["cublas_fp8_block_tflops"] for r in sub]
            print(f"M = {M}, {key}: geomean {torch.tensor(ratios).log().mean().exp():.3f}x cuBLAS per-tensor, "
                  f"{torch.tensor(block).log().mean().exp():.3f}x blockwise over {len(sub)} shapes")


if __name__ == "__main__":
    main()
