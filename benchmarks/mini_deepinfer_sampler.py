"""Sampler timing on CUDA: the Triton Gumbel-max kernel vs the torch reference (same tokens), vocab 129,280.

    python3 benchmarks/mini_deepinfer_sampler.py [--out results.json]

Median of triton.testing.do_bench (25 ms warm-up, 100 ms measurement) on random fp32 logits (randn * 3), half the
rows greedy and half at temperature 0.8, no top-k / top-p. Prints a table and writes JSON with the environment.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from mini_deepinfer.layers.sampler import SamplingBatch, gumbel_argmax_torch, gumbel_argmax_triton, sample_keys

VOCAB = 129280


def main() -> None:
    import triton
    from triton.testing import do_bench

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows_list = [1, 8, 64, 256]
    results = []
    for rows in rows_list:
        g = torch.Generator(device="cuda").manual_seed(rows)
        logits = torch.randn(rows, VOCAB, device="cuda", generator=g) * 3
        sb = SamplingBatch.build([0.0 if r % 2 else 0.8 for r in range(rows)], [-1] * rows, [1.0] * rows,
                                 list(range(rows)), [7] * rows, "cuda")
        keys = sample_keys(sb.seeds, sb.positions)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        same = torch.equal(gumbel_argmax_triton(logits, sb.temperatures, keys, out),
                           gumbel_argmax_torch(logits, sb.temperatures, keys))
        t_triton = do_bench(lambda: gumbel_argmax_triton(logits, sb.temperatures, keys, out), warmup=25, rep=100)
        t_torch = do_bench(lambda: gumbel_argmax_torch(logits, sb.temperatures, keys), warmup=25, rep=100)
        results.append(dict(rows=rows, vocab=VOCAB, triton_ms=t_triton, torch_ms=t_torch, identical=same,
                            logits_gb_s=rows * VOCAB * 4 / (t_triton * 1e-3) / 1e9))
    env = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
               method="triton.testing.do_bench median, warmup 25 ms, rep 100 ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(env=env, results=results), f, indent=2)
    print(env)
    print(f"{'rows':>5} {'triton ms':>10} {'torch ms':>10} {'speed-up':>9} {'logits GB/s':>12} identical")
    for r in results:
        print(f"{r['rows']:>5} {r['triton_ms']:>10.4f} {r['torch_ms']:>10.4f} {r['torch_ms'] / r['triton_ms']:>9.1f} "
              f"{r['logits_gb_s']:>12.1f} {r['identical']}")


if __name__ == "__main__":
    main()
