"""Experiment (session 30): the host side of the fused RMSNorm (runtime/src/mini_deepinfer/layers/rmsnorm.py).

Why: run 2 measured eager decode (no CUDA graphs; medium model, batch 32 / 64 at 131,072 tokens) 38 -> 48 ms/step
with the fused kernel, host-bound in both trees, while the graph modes got faster (10.21 -> 9.85 ms at batch 32).
Two questions:
1. Host microseconds per call, issue rate without waiting (2,000 calls, then one synchronize): the fused kernel's
   one Triton launch against ops.rmsnorm's seven torch ops, and a hyper-connection Triton kernel for scale.
2. How many norm calls an eager decode step makes, and the host time inside them: bench_decode (medium, batch 32,
   131,072 tokens) once with the norms counted on the fused path and once with ops.norm forced onto ops.rmsnorm.

    python3 benchmarks/exp_norm_host.py
"""

from __future__ import annotations

import functools
import os
import sys
import time

import torch

import bench_decode  # beside this file
from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.layers import rmsnorm as rmsf
from mini_deepinfer.models.deepseek_v41 import ops

EPS = 1e-20


def host_us(fn, n: int = 2000) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    return issued / n * 1e6


def per_call() -> None:
    for T, D in ((32, 5120), (32, 512), (1, 512), (4096, 5120)):
        x = torch.randn(T, D, device="cuda").to(torch.bfloat16)
        w = torch.rand(D, device="cuda").to(torch.bfloat16)
        H = torch.randn(T, 4, D, device="cuda").to(torch.bfloat16)
        pre = torch.rand(T, 4, device="cuda")
        print(f"T={T} D={D}: host us per call: ops.rmsnorm {host_us(lambda: ops.rmsnorm(x, w, EPS)):.1f}, "
              f"rmsnorm_fused {host_us(lambda: rmsf.rmsnorm_fused(x, w, EPS)):.1f}, "
              f"hc_collapse_fused {host_us(lambda: hcf.hc_collapse_fused(H, pre)):.1f}", flush=True)


def counted(owner, name: str, totals: dict) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        totals["calls"] += 1
        totals["host_s"] += time.perf_counter() - t0
        return out
    setattr(owner, name, wrapper)


def decode(fused: bool) -> None:
    totals = {"calls": 0, "host_s": 0.0}
    if fused:
        counted(rmsf, "rmsnorm_fused", totals)
    else:
        rmsf.available = lambda x: False
        counted(ops, "rmsnorm", totals)
    t0 = time.perf_counter()
    res = bench_decode.main(["--preset", "medium", "--batches", "32", "--contexts", "131072", "--kv-cache-gb", "8",
                             "--out", os.path.join(os.environ.get("OUT", "."), f"exp_norm_host_{int(fused)}.json")])
    wall = time.perf_counter() - t0
    modes = ", ".join(f"zos={int(v['zos'])} graphs={int(v['cuda_graphs'])} {v['ms_per_step']:.2f} ms"
                      for v in res["results"][0]["variants"])
    print(f"{'fused' if fused else 'torch'}: {modes}; norm calls {totals['calls']}, host in them "
          f"{totals['host_s']:.2f} s of {wall:.1f} s ({1e6 * totals['host_s'] / max(totals['calls'], 1):.1f} us "
          "per call)", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--per-call"]:
        per_call()
    else:
        decode(fused=sys.argv[1:] != ["--torch"])
