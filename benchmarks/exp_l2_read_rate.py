"""Measurement (session 71): how fast the SMs read data that sits in L2, beside the device copy's HBM rate.

Why: the contiguous MoE kernel's 256-row tiles read ~40 KB per K step by TMA, mostly activation tiles that other
column tiles of the same rows brought into L2 (docs/reports/deepgemm-moe-fold-128.md, "Session 71"): ~4.4 TB/s across
the SMs at 764 TFLOP/s. Whether that is near a limit needs the L2's read rate, which nothing in the repo measured.

How: one Triton kernel, PROGRAMS_PER_SM programs per SM (4 warps each, so that up to ~6 fit an SM's registers),
each reading a whole buffer of SIZES_MB in 16 KB chunks (int32 loads with .cg: cached in L2, not in L1), starting at
a chunk of its own so that the programs spread over the L2's slices, and XOR-reducing what it read into one word (so
that no load is dead). The buffers fit in L2 (50 MB on the H100 and the H200), so after the first pass every read is
an L2 hit. Rate = programs x bytes / GPU time (CUDA-graph replay, exp_gemm_gluon_v3.ms), beside the device copy
(HBM read + write, bench_deepgemm). Writes $OUT/exp_l2_read_rate.json.

    cd benchmarks && python3 exp_l2_read_rate.py
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from bench_deepgemm import copy_bandwidth_gbs
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms

CHUNK = 4096  # int32 per load step: 16 KB per program and step
SIZES_MB = (4, 16, 32)
PROGRAMS_PER_SM = (2, 4, 6)


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def read_all_kernel(src_ptr, out_ptr, n_chunks, CHUNK: tl.constexpr):
    """Program p reads every chunk of src once, from chunk p % n_chunks on, and stores the XOR of what it read."""
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.int32)
    for i in range(n_chunks):
        chunk = (pid + i) % n_chunks
        acc ^= tl.load(src_ptr + chunk.to(tl.int64) * CHUNK + offs, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


def read_rate_gbs(src: torch.Tensor, programs: int) -> float:
    """GB/s at which `programs` programs each read all of src."""
    out = torch.empty(programs, dtype=torch.int32, device=src.device)
    n_chunks = src.numel() // CHUNK
    t = ms(lambda: read_all_kernel[(programs,)](src, out, n_chunks, CHUNK=CHUNK, num_warps=4))
    return programs * src.numel() * 4 / t / 1e6


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    result = {"environment": environment(dev), "sms": sms, "copy_gbs": copy_bandwidth_gbs(), "rows": []}
    print(f"device copy (read + write): {result['copy_gbs']:.0f} GB/s, {sms} SMs", flush=True)
    for size_mb in SIZES_MB:
        src = torch.randint(-2**31, 2**31 - 1, (size_mb << 18,), dtype=torch.int32, device=dev)
        for per_sm in PROGRAMS_PER_SM:
            gbs = read_rate_gbs(src, sms * per_sm)
            row = {"buffer_mb": size_mb, "programs": sms * per_sm, "read_gbs": gbs,
                   "per_sm_bytes_per_ns": gbs / sms}
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
        del src
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_l2_read_rate.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| buffer | programs | read GB/s | per SM, B/ns |")
    for r in result["rows"]:
        print(f"| {r['buffer_mb']} MB | {r['programs']} | {r['read_gbs']:.0f} | {r['per_sm_bytes_per_ns']:.1f} |")


if __name__ == "__main__":
    main()
