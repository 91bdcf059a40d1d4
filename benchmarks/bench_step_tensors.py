"""Host time of StepTensors.build (the decode step's device inputs) at long context, on this machine's CPU.

    python3 benchmarks/bench_step_tensors.py [--out results.json]

Block tables of ~1,025 blocks (131k tokens at 128 per block), batch 32 / 64 / 256, built for the CPU device (the
host-side work is the same as for CUDA, less the pinned copy). Best of 5 repetitions of 5 calls. The CUDA path is
timed by bench_decode.py's "host busy" column.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch

from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

WIDTH = 1025


def best_ms(fn, calls: int = 5, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rng = random.Random(0)
    rows = []
    for batch in (32, 64, 256):
        tables = [[rng.randrange(1, 100000) for _ in range(WIDTH - i % 3)] for i in range(batch)]
        fb = ForwardBatch(input_ids=torch.zeros(batch, dtype=torch.int64), query_lens=[1] * batch,
                          context_lens=[131072] * batch, block_tables=tables, slots=list(range(batch)),
                          sample_rows=list(range(batch)))
        rows.append({"batch": batch, "width": WIDTH,
                     "build_ms": best_ms(lambda: StepTensors.build(fb, torch.device("cpu"), WIDTH))})
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": platform.processor() or platform.machine(),
           "python": platform.python_version(), "torch": torch.__version__, "method": "best of 5 x 5 calls"}
    print(env)
    for r in rows:
        print(f"batch {r['batch']:4d} x {r['width']} blocks: {r['build_ms']:.2f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
