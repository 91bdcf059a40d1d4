"""The decode step's tail on CUDA: the output head (fp32 logits) and the Gumbel-max sampler, V4.1 widths.

    python3 benchmarks/bench_logits_sampler.py [--out results.json] [--sampler-only]

Head: logits fp32 [rows, 129,280] = y @ head^T with y and the head bf16 (D = 5,120): layers/linear_fp32.py's
kernel against the reference's `y.float() @ head.float().T` (what the engine ran until session 15: an fp32 copy
of the 1.3 GB head at every call, then cuBLAS's fp32 GEMM) and against cuBLAS bf16 `torch.matmul` (bf16 output:
a speed peer only), with the relative L2 error against the fp32 reference and the head's bytes / time.
Sampler: the sliced kernel (VOCAB_SLICE entries per program) against one program per row (the layout before
session 15) and the torch reference, same tokens required; all rows greedy, half greedy and half at temperature
0.8, all at 0.8 (before session 43: the half mix only).
Timing: the head by the median of triton.testing.do_bench (25 ms warm-up, 100 ms measurement); the sampler by
CUDA-graph replay (do_bench_cudagraph, median; do_bench before session 43). Prints tables; writes JSON with the
environment.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from mini_deepinfer.layers.linear_fp32 import linear_fp32, linear_fp32_ref
from mini_deepinfer.layers.sampler import (VOCAB_SLICE, SamplingBatch, gumbel_argmax_torch, gumbel_argmax_triton,
                                           sample_keys)

VOCAB, DIM = 129280, 5120
ROWS = [1, 8, 32, 64, 256]


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100)


def head_rows(head: torch.Tensor) -> list[dict]:
    out = []
    for rows in ROWS:
        y = torch.randn(rows, DIM, device="cuda", generator=torch.Generator(device="cuda").manual_seed(rows))
        y = y.to(torch.bfloat16)
        ref = linear_fp32_ref(y, head)
        err = float((linear_fp32(y, head) - ref).norm() / ref.norm())
        t_kernel = bench(lambda: linear_fp32(y, head))
        t_ref = bench(lambda: linear_fp32_ref(y, head))
        t_bf16 = bench(lambda: torch.matmul(y, head.T))
        out.append(dict(rows=rows, kernel_ms=t_kernel, fp32_reference_ms=t_ref, cublas_bf16_ms=t_bf16,
                        rel_l2_vs_fp32_reference=err,
                        kernel_head_tb_s=head.numel() * 2 / (t_kernel * 1e-3) / 1e12))
    return out


def graph_ms(fn) -> float:
    """GPU time per call by CUDA-graph replay: the sampler's ~10-150 us calls, without do_bench's launch path."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=100)


# the rows' temperatures: all greedy (the decode benchmark's), half greedy, all sampled
SAMPLER_MIXES = {"greedy": lambda r: 0.0, "half": lambda r: 0.0 if r % 2 else 0.8, "sampled": lambda r: 0.8}


def sampler_rows() -> list[dict]:
    out = []
    one_per_row = -(-VOCAB // 2048) * 2048
    for rows in ROWS:
        g = torch.Generator(device="cuda").manual_seed(rows)
        logits = torch.randn(rows, VOCAB, device="cuda", generator=g) * 3
        for mix, temperature in SAMPLER_MIXES.items():
            sb = SamplingBatch.build([temperature(r) for r in range(rows)], [-1] * rows, [1.0] * rows,
                                     list(range(rows)), [7] * rows, "cuda")
            keys = sample_keys(sb.seeds, sb.positions)
            out_ids = torch.empty(rows, dtype=torch.int64, device="cuda")
            want = gumbel_argmax_torch(logits, sb.temperatures, keys)
            same = torch.equal(gumbel_argmax_triton(logits, sb.temperatures, keys, out_ids), want) and torch.equal(
                gumbel_argmax_triton(logits, sb.temperatures, keys, out_ids, vocab_slice=one_per_row), want)
            out.append(dict(
                rows=rows, mix=mix, vocab=VOCAB, vocab_slice=VOCAB_SLICE, identical=same,
                sliced_ms=graph_ms(lambda: gumbel_argmax_triton(logits, sb.temperatures, keys, out_ids)),
                one_program_per_row_ms=graph_ms(lambda: gumbel_argmax_triton(
                    logits, sb.temperatures, keys, out_ids, vocab_slice=one_per_row)),
                torch_ms=graph_ms(lambda: gumbel_argmax_torch(logits, sb.temperatures, keys))))
    return out


def main() -> None:
    import triton

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--sampler-only", action="store_true", help="skip the head's rows")
    args = parser.parse_args()
    heads = []
    if not args.sampler_only:
        head = (torch.randn(VOCAB, DIM, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
                * DIM**-0.5).to(torch.bfloat16)
        heads = head_rows(head)
        del head
    samplers = sampler_rows()
    env = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=torch.cuda.get_device_name(),
               torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
               shapes=dict(vocab=VOCAB, dim=DIM, rows=ROWS), dtype="bf16 y and head, fp32 logits",
               method="head: triton.testing.do_bench median, warmup 25 ms, rep 100 ms; "
                      "sampler: do_bench_cudagraph median")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(env=env, head=heads, sampler=samplers), f, indent=2)
    print(env)
    print("| rows | head kernel ms | fp32 reference ms | cuBLAS bf16 ms | reference / kernel | head TB/s | rel L2 |")
    for r in heads:
        print(f"| {r['rows']} | {r['kernel_ms']:.4f} | {r['fp32_reference_ms']:.4f} | {r['cublas_bf16_ms']:.4f} | "
              f"{r['fp32_reference_ms'] / r['kernel_ms']:.1f} | {r['kernel_head_tb_s']:.2f} | "
              f"{r['rel_l2_vs_fp32_reference']:.1e} |")
    print("| rows | temperatures | sampler sliced ms | one program per row ms | torch ms | per-row / sliced | "
          "identical |")
    for r in samplers:
        print(f"| {r['rows']} | {r['mix']} | {r['sliced_ms']:.4f} | {r['one_program_per_row_ms']:.4f} | "
              f"{r['torch_ms']:.4f} | {r['one_program_per_row_ms'] / r['sliced_ms']:.1f} | {r['identical']} |")


if __name__ == "__main__":
    main()
