"""Experiment (issue 4, session 28 run 2): why the V3 kernel's last-wave split (exp_gemm_v3_tail.py, run 1) gained
0.5% at wq_a where the wave count promised 1.2x. Times the kernel on fewer persistent programs than SMs, so that a
tile's time can be read at each count of busy SMs, whole tiles and column halves alike.

For wq_a (1,280 x 5,120) and wo_b (5,120 x 8,192) at M = 4,096, 128- and 256-column tiles, and 132 / 99 / 66 / 33 /
8 programs: the kernel's GPU time (CUDA-graph replay, median) with every tile whole, and with every tile split into
column halves (GLUON_FULL_TILES = 0); at 128 columns on 132 programs also a 6-slot ring against the 4 shipped. Per program the busiest one runs ceil(items / programs) items, so
item time = kernel time / that count. If a tile's time were its MMA work, it would not depend on the programs, and
a half would take half a tile. Writes $OUT/exp_gemm_v3_occupancy.json and prints a table.

    cd benchmarks && timeout 200 python3 exp_gemm_v3_occupancy.py
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch
import triton

from bench_deepgemm import dense_operands  # beside this script
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm._backend import cdiv
from mini_deepgemm.gemm_gluon_fp8_kernel import fp8_gemm_v3_kernel

SHAPES = {"wq_a": (1280, 5120), "wo_b": (5120, 8192)}
PROGRAMS = (132, 99, 66, 33, 8)


def launch(aq, sa, bq, sb, d, block_n: int, programs: int, split: bool, stages: int = 4) -> None:
    """The kernel as gemm._gluon_fp8_v3_gemm launches it (128 rows, `stages` ring slots), on `programs` programs,
    every tile whole or (split) every tile as two column halves."""
    M, K = aq.shape
    N = bq.shape[0]
    tiles = cdiv(M, 128) * cdiv(N, block_n)
    full = 0 if split else tiles
    _, maxnreg = G._dense_gluon_launch(tiles, 128, 1, d.device)
    b_desc = G._tma_desc(bq, (block_n, 128))
    fp8_gemm_v3_kernel[(min(2 * tiles - full, programs),)](
        G._tma_desc(aq, (128, 128)), b_desc, G._tma_desc(bq, (block_n // 2, 128)) if split else b_desc,
        G._tma_desc(d, (64, 128)), d, sa, sb, M, N, K, sa.stride(0), sb.stride(0), d.stride(0), full,
        STAGES=stages, GROUP_M=8, CONSUMER_REGS=G._GLUON_CONSUMER_REGS, PRODUCER_REGS=G._GLUON_PRODUCER_REGS, TAIL=split,
        num_warps=4, maxnreg=maxnreg)


def main() -> None:
    rows, M = [], 4096
    for name, (N, K) in SHAPES.items():
        op = dense_operands(M, N, K)
        (aq, sa), (bq, sb) = op["v3"]
        d = op["d"]
        for block_n in (128, 256):
            tiles = cdiv(M, 128) * cdiv(N, block_n)
            for programs in PROGRAMS:
                row = dict(name=name, M=M, N=N, K=K, block_n=block_n, programs=programs, tiles=tiles)
                for split in (False, True):
                    items = 2 * tiles if split else tiles
                    us = ms(lambda: launch(aq, sa, bq, sb, d, block_n, programs, split)) * 1e3
                    key = "half" if split else "whole"
                    row[f"{key}_us"] = us
                    row[f"{key}_item_us"] = us / cdiv(items, programs)
                row["half_over_whole_item"] = row["half_item_us"] / row["whole_item_us"]
                if block_n == 128 and programs == PROGRAMS[0]:
                    # a deeper ring where shared memory allows it (128 columns: 6 x 32 KB + 32 KB of store buffers):
                    # if a tile's steps wait on their loads' latency, more slots in flight shorten them
                    row["whole_6_stages_us"] = ms(lambda: launch(aq, sa, bq, sb, d, block_n, programs, False, 6)) * 1e3
                rows.append(row)
                print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                timing="triton.testing.do_bench_cudagraph median, rep 100")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v3_occupancy.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("| shape | columns | programs | whole: kernel us | whole: us per tile | halves: kernel us | halves: us per "
          "half | half / whole |")
    for r in rows:
        if "whole_6_stages_us" in r:
            print(f"({r['name']}, 128 columns, {r['programs']} programs: 6 stages {r['whole_6_stages_us']:.1f} us "
                  f"against 4 stages {r['whole_us']:.1f})")
        print(f"| {r['name']} | {r['block_n']} | {r['programs']} | {r['whole_us']:.1f} | {r['whole_item_us']:.2f} | "
              f"{r['half_us']:.1f} | {r['half_item_us']:.2f} | {r['half_over_whole_item']:.2f} |")


if __name__ == "__main__":
    main()
