"""Session 77 experiment: the Triton attention's two cache sources in separate launches (the Triton route, paged rows).

Why: session 77's Nsight Compute report of the paged prefill (docs/reports/data/s77-run1/ncu) puts the kernel's time in
its spills: 768 B per thread x 256 threads do not fit the L1 left beside 131 KB of shared memory (hit rate 3%), so the
local traffic reaches L2 (5.7x the sectors of the gathers) and long-scoreboard waits take half the stall samples.
Compiled with one source, the kernel spills 40 B (FP8 window rows) or 376 B (FP4 compressed rows; triton 3.6). So each
source as its own launch, writing a partial (out, lse) that the split path's combine kernel merges, might beat the
two-loop kernel even with the partials' round trip. Measured (H100, runs 2-4): 1.017x at prefill, 0.75x at decode batch
64, and the nearly spill-free window launch no faster per block than the spilling kernel: the spills do not bind
(docs/reports/triton-route-on-hopper.md, "Session 77"). Not shipped.

What it times (CUDA-graph replay, bench_flashmla's prefill case and decode batches): the API as routed (both sources in
one kernel), then `one_source`: the window-only launch, the compressed-only launch and the combine, the three as one
call, and each launch alone; it checks the call against the API (max abs difference of the outputs: the partials are
rounded to bf16, as the split decode's are). STAGES (environment, default 1) sets the one-source launches' pipelining
depth. `profile_call` is profile_ncu.py's hook for one launch. Offline (`--compile`, no GPU): the three kernels'
registers and spills for sm_90.

Usage: MINI_DEEPGEMM_GLUON=0 python3 exp_attn_one_source.py   (GPU, from benchmarks/)
       MINI_DEEPGEMM_GLUON=0 PYTHONPATH=integration_tests:... python3 benchmarks/exp_attn_one_source.py --compile
"""

from __future__ import annotations

import math
import os
import sys

import torch

from mini_flashmla import api
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, WINDOW_ROW_BYTES

STAGES = int(os.environ.get("STAGES", "1"))  # the one-source launches' pipelining depth (the API's: 1)


def one_source(q, window_cache, compressed_cache, wid, cid, sm_scale, sink, parts=(0, 1), combine=True):
    """The paged call with each source in its own launch of sparse_mla_fwd_kernel (HAS_B false), each writing one
    partial of [s_q, 2, h, 512] (window, compressed), then combine_splits_kernel: out bf16 [s_q, h, 512], lse."""
    from mini_flashmla.sparse_attn_kernel import (FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW, LOG2E,
                                                  sparse_mla_fwd_kernel)

    s_q, h, d = q.shape
    out = torch.empty((s_q, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((s_q, h), dtype=torch.float32, device=q.device)
    part_out, part_lse = api._split_partials(q, 2)
    for i, (rows, ids, fmt) in enumerate(((window_cache, wid, FORMAT_FP8_WINDOW),
                                          (compressed_cache, cid, FORMAT_FP4_COMPRESSED))):
        if i not in parts:
            continue
        ids = ids.to(torch.int32).contiguous()
        n_blocks = math.ceil(ids.shape[1] / api.ATTN_BLOCK_N)
        # the partial of source i: part_out[:, i] is a view with the batch stride of 2 partials; the kernel's SPLIT path
        # writes row (sq * num_splits + split) * h, so a launch of one split over num_splits = 2 with its pointers moved
        # by i partials writes slot i
        sparse_mla_fwd_kernel[(s_q, h // api.MAX_ATTN_BLOCK_H, 1)](
            q, q.stride(0), q.stride(1),
            rows, ids, ids.stride(0), ids.shape[1], rows.shape[0],
            rows, ids, ids.stride(0), 0, rows.shape[0],
            sink, out, out.stride(0), out.stride(1), lse, lse.stride(0), part_out[:, i], part_lse[:, i],
            h, 2, n_blocks, sm_scale * LOG2E.value,
            A_FORMAT=fmt, B_FORMAT=fmt, HAS_B=False, HAS_SINK=False, SPLIT=True,
            BLOCK_H=api.MAX_ATTN_BLOCK_H, BLOCK_N=api.ATTN_BLOCK_N, D=d, FP4_ASM=q.is_cuda,
            num_warps=8, num_stages=STAGES, enable_fp_fusion=True)
    if combine:
        api._combine_splits(part_out, part_lse, sink, True, out, lse)
    return out, lse


def profile_call(part: str):
    """profile_ncu.py's MODULE:FACTORY:ARG hook: the prefill case's launch of source `part` (0 window, 1 compressed)."""
    import bench_flashmla as bf

    c = bf.prefill_case(torch.device("cuda"))
    args = (c["q"], c["window_cache"], c["compressed_cache"], c["wid"], c["cid"], bf.SCALE, c["sink"])
    return lambda: one_source(*args, parts=(int(part),), combine=False)


def compile_only() -> None:
    sys.path.insert(0, "integration_tests")
    from sm90_compile import compiling_for_sm90, cuda_like

    s_q, h, d = 4096, 64, 512
    with compiling_for_sm90() as kernels:
        one_source(cuda_like(torch.empty(s_q, h, d, dtype=torch.bfloat16)),
                   cuda_like(torch.empty(8192, WINDOW_ROW_BYTES, dtype=torch.uint8)),
                   cuda_like(torch.empty(65536, COMPRESSED_KV_ROW_BYTES, dtype=torch.uint8)),
                   cuda_like(torch.empty(s_q, 128, dtype=torch.int32)),
                   cuda_like(torch.empty(s_q, 512, dtype=torch.int32)), d ** -0.5,
                   cuda_like(torch.empty(h, dtype=torch.float32)))
    for k in kernels:
        print(f"{k.name:28s} {k.constexprs[:60]:60s} regs {k.registers} spills {k.local_bytes} B smem {k.shared_bytes}")


def main() -> None:
    import bench_flashmla as bf
    from triton.testing import do_bench_cudagraph

    from mini_flashmla import sparse_mla_fwd_paged

    cases = bf.paged_cases(torch.device("cuda"), (64, 128, 256))
    print("| case | API (both sources, one kernel) us | one source per launch + combine us | ratio | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for name, q, window_cache, compressed_cache, wid, cid, sink in cases:
        args = (q, window_cache, compressed_cache, wid, cid, bf.SCALE, sink)
        ref, _ = sparse_mla_fwd_paged(*args)
        new, _ = one_source(*args)
        diff = (ref.float() - new.float()).abs().max().item()
        t_api = do_bench_cudagraph(lambda: sparse_mla_fwd_paged(*args)) * 1e3
        t_new = do_bench_cudagraph(lambda: one_source(*args)) * 1e3
        t_parts = [do_bench_cudagraph(lambda i=i: one_source(*args, parts=(i,), combine=False)) * 1e3 for i in (0, 1)]
        print(f"| {name} | {t_api:.1f} | {t_new:.1f} | {t_api / t_new:.3f} | {diff:.2e} | window {t_parts[0]:.1f}, "
              f"compressed {t_parts[1]:.1f} |", flush=True)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
