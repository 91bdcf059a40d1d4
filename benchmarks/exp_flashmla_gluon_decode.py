"""Experiment (issue 5): the Gluon attention kernel on decode at batch 256 (one query per sequence, paged FP8
window + FP4 compressed cache, 131k context), which session 12 run 4's bench_flashmla measured at 548.6 us against
116-132 us in session 11 (runs 5 and 7) and the Triton kernel's 187.3 us. Between those runs the kernel's softmax
row sums moved from a per-block reduction to one after the walk (session 12; offline, 8-12 bytes of spill stores
appeared). This times, interleaved and three times each, at batch 256 and 132 (one program per SM): the shipped
kernel, the kernel with the per-block row sums restored (the inverse source edit, in a temporary module), and the
Triton kernel (one split), by do_bench (as bench_flashmla) and by CUDA-graph replay. Writes
$OUT/exp_flashmla_gluon_decode.json.

    cd benchmarks && timeout 120 python3 exp_flashmla_gluon_decode.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import mini_flashmla
import mini_flashmla.sparse_attn_gluon_kernel as kernel_module
import torch
import triton
from bench_flashmla import SCALE, bench, decode_case
from mini_flashmla import api
from mini_flashmla.sparse_attn_kernel import FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW
from source_variants import edited_module

PER_BLOCK_ROW_SUMS = [(re.compile(a), b) for a, b in [
    (r"l_cols = gl.full\(\[HEADS, BLOCK_N\], 0.0, gl.float32, S_MMA\)",
     "l_i = gl.full([HEADS], 0.0, gl.float32, gl.SliceLayout(1, S_MMA))"),
    (r"l_cols = l_cols \* alpha\[:, None\] \+ p", "l_i = l_i * alpha + gl.sum(p, 1)"),
    (r"\n    l_i = gl.sum\(l_cols, 1\)", ""),
]]


def main() -> None:
    dev = torch.device("cuda")
    shipped = kernel_module.sparse_mla_fwd_gluon_kernel
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    g = torch.Generator(device=dev).manual_seed(1)
    with tempfile.TemporaryDirectory() as workdir:
        per_block = edited_module(kernel_module, PER_BLOCK_ROW_SUMS, "attn_per_block_row_sums", workdir)
        kernels = {"shipped": shipped, "per_block_row_sums": per_block.sparse_mla_fwd_gluon_kernel}
        for batch in (132, 256):
            q, window_cache, compressed_cache, wid, cid, sink = decode_case(dev, batch, g)
            sources = (window_cache, wid, FORMAT_FP8_WINDOW.value), (compressed_cache, cid, FORMAT_FP4_COMPRESSED.value)
            calls = {"triton": lambda: api._launch_sparse_attn(q, *sources, SCALE, sink, 1)}

            def gluon_call(kernel):
                def call():
                    kernel_module.sparse_mla_fwd_gluon_kernel = kernel  # _launch_gluon imports it at call time
                    return mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, SCALE,
                                                              sink, 1)
                return call

            for name, kernel in kernels.items():
                calls[name] = gluon_call(kernel)
            for rep in range(3):
                for name, fn in calls.items():
                    result.setdefault(f"b{batch}_{name}_us", []).append(bench(fn) * 1e3)
                    result.setdefault(f"b{batch}_{name}_graph_us", []).append(
                        triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
            out_a = calls["shipped"]()[0]
            out_b = calls["per_block_row_sums"]()[0]
            result[f"b{batch}_rel_l2_shipped_vs_per_block"] = ((out_a.float() - out_b.float()).norm()
                                                              / out_b.float().norm()).item()
    kernel_module.sparse_mla_fwd_gluon_kernel = shipped
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_gluon_decode.json"), "w") as f:
        json.dump(result, f, indent=1)
    for k, v in result.items():
        print(f"{k:45s} {[round(t, 1) for t in v] if isinstance(v, list) else v}")


if __name__ == "__main__":
    main()
