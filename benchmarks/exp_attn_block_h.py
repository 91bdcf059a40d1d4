"""Session 78 experiment: the Triton attention with fewer heads per program (the Triton route, paged rows).

Why: session 77 found what binds the Triton route's attention on Hopper (docs/reports/triton-route-on-hopper.md,
"Session 77"): one program per SM, because a 64-head program's 64 x 512 fp32 accumulator takes half the registers,
runs each block's gather, dequantization and MMAs in sequence with nothing beside it to run while it waits. A program
of 32 (or 16) heads holds half (a quarter) of that accumulator, so two (four) programs fit an SM and one's MMAs can run
under another's gathers. The price: every head block gathers and dequantizes the same rows (twice or four times the
decode work and L2 reads), and below 64 rows triton 3.6 gives the dot Ampere's mma.sync instead of wgmma.

What it times (CUDA-graph replay, bench_flashmla's prefill case and decode batches 8-256): the API's launch (64-head
programs), then the same kernel through the API at each of VARIANTS (heads per program, warps, register cap, slots
per block; the environment's VARIANTS adds its own), the decode split rule counting the head blocks' programs. Each
variant's output is compared with the 64-head call (max abs difference; the MMA instruction differs, so the fp32 sums
may too). Offline (`--compile`, no GPU): each variant's registers, spills and shared memory for sm_90.

Found (H100, session 78 run 1): every variant is slower, the best (32 heads, 4 warps, 32-slot blocks) 1.52x the time
at prefill and 1.37-1.62x at decode (docs/reports/triton-route-on-hopper.md, "Session 78").

Usage: MINI_DEEPGEMM_GLUON=0 python3 exp_attn_block_h.py   (GPU, from benchmarks/)
       MINI_DEEPGEMM_GLUON=0 PYTHONPATH=integration_tests:... python3 benchmarks/exp_attn_block_h.py --compile
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch

from mini_flashmla import api

# (heads per program, num_warps, register cap or 0 for the compiler's choice, slots per block); the first is the API's
VARIANTS = [(64, 8, 0, 64), (32, 4, 0, 64), (32, 8, 128, 64), (16, 4, 0, 64), (16, 8, 128, 64),
            (32, 4, 0, 32), (32, 8, 128, 32), (16, 4, 128, 32)]
if os.environ.get("VARIANTS"):  # e.g. "32,8,128,64 16,4,0,32"
    VARIANTS = [VARIANTS[0]] + [tuple(int(x) for x in v.split(",")) for v in os.environ["VARIANTS"].split()]


@contextmanager
def heads_per_program(block_h: int, num_warps: int, maxnreg: int, block_n: int):
    """The API's Triton launch with `block_h` heads per program, `num_warps`, 1 stage, a register cap (0: none) and
    blocks of `block_n` slots (the online softmax's step: at 32, the reference's P rounds differently); api's split rule
    counts programs and blocks with the same constants, so a decode call splits for the larger grid."""
    saved = api.MAX_ATTN_BLOCK_H, api._attn_launch, api.ATTN_BLOCK_N
    api.MAX_ATTN_BLOCK_H, api.ATTN_BLOCK_N = block_h, block_n
    cap = {"maxnreg": maxnreg} if maxnreg else {}
    api._attn_launch = lambda bf16_rows, bh, q: {"num_warps": num_warps, "num_stages": 1, **cap}
    try:
        yield
    finally:
        api.MAX_ATTN_BLOCK_H, api._attn_launch, api.ATTN_BLOCK_N = saved


def paged(q, window_cache, compressed_cache, wid, cid, sink, scale):
    return api.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, scale, sink)


def compile_only() -> None:
    sys.path.insert(0, "integration_tests")
    from sm90_compile import compiling_for_sm90
    from test_compile_sm90_flashmla import attn_paged

    for s_q in (4096, 64):
        for block_h, num_warps, maxnreg, block_n in VARIANTS:
            with compiling_for_sm90() as kernels, heads_per_program(block_h, num_warps, maxnreg, block_n):
                attn_paged(s_q)
            for k in kernels:
                if k.name.startswith("sparse_mla_fwd"):
                    threads = 32 * k.num_warps
                    print(f"s_q {s_q:5d} heads {block_h:2d} warps {k.num_warps} cap {maxnreg:3d} slots {block_n}: "
                          f"regs {k.registers} spills {k.local_bytes} B smem {k.shared_bytes} B; programs per SM by "
                          f"registers {65536 // (k.registers * threads)}, by smem {232448 // max(k.shared_bytes, 1)}")


def main() -> None:
    import bench_flashmla as bf
    from triton.testing import do_bench_cudagraph

    cases = bf.paged_cases(torch.device("cuda"), (8, 64, 128, 256))
    names = " | ".join(f"{bh} heads, {w} warps, cap {r or '-'}, {n} slots" for bh, w, r, n in VARIANTS)
    print(f"| case | {names} |")
    print("|---|" + "---:|" * len(VARIANTS))
    for name, *args in cases:
        args = (*args, bf.SCALE)
        ref, _ = paged(*args)
        cells = []
        for variant in VARIANTS:
            with heads_per_program(*variant):
                out, _ = paged(*args)
                diff = (ref.float() - out.float()).abs().max().item()
                t = do_bench_cudagraph(lambda: paged(*args)) * 1e3
            cells.append(f"{t:.1f} us ({diff:.1e})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
