"""Experiment (issue 5): does the attention's softmax speed up when the producer stays off the issue slots, and what
does that cost the tiles?

Session 59's trace (flashmla-gluon.md, "Session 59") found the owner's softmax at ~650 cycles while the producer is
idle and ~1,250 while it converts: a scheduler holds one warp of each consumer warpgroup and one producer warp. The
fill of block a' (tile 0) starts when warpgroup 1 releases tile 0, which is when warpgroup 1's softmax of block b
starts. Here the producer sleeps (nanosleep) right after that wait, on tile 0's fills only (paged rows), for 0 (the
shipped kernel) to 700 ns, and each variant runs bench_flashmla's paged prefill case traced (the trace of
exp_flashmla_trace.py): its time, warpgroup 1's softmax, and the waits it may move (warpgroup 0's for tile a and for
block b's P, the producer's fill). Variants are edits of the kernel's source (source_variants.py); their outputs
must equal the shipped kernel's (the sleep changes no value). Writes $OUT/exp_flashmla_yield.json.

    cd benchmarks && python3 exp_flashmla_yield.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import mini_flashmla.sparse_attn_gluon_kernel as kernel_module
import torch
from bench_flashmla import S_Q, bench, environment, prefill_case
from exp_flashmla_trace import HEADER, TRACE_EVENTS, TRACE_ROLES, sm_gaps, step_cycles, traced_call
from source_variants import edited_module

# the producer's trace mark after its wait for a free tile, in the quantized path (16 spaces in; main's kernel, and
# with its `item` argument the persistent one of b8f12bf, whose bf16 path then matches too)
TILE_FREE_MARK = re.compile(r"^( {16})(_mark\(trace_ptr, (?:item, )?2, 2 \* blk\)\n)", re.M)


def sleep_edit(ns: int) -> list:
    """The producer sleeps ns nanoseconds after finding tile 0 free, before filling it."""
    return [(TILE_FREE_MARK, rf"""\1\2\1if t == 0:
\1    gl.inline_asm_elementwise("nanosleep.u32 {ns}; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
\1                              pack=1)
""")]


VARIANTS = {"shipped": [], **{f"sleep_{ns}ns": sleep_edit(ns) for ns in (200, 400, 700)}}
STEPS = ["wg1: softmax b", "wg0: tile a in (wait)", "wg0: adopt b (wait + rescale)", "wg1: tile b in (wait)",
         "producer: fill (tile free -> handed over)"]


def main() -> None:
    dev = torch.device("cuda")
    result = environment(dev)
    case = prefill_case(dev)
    n_blocks = case["idx"].shape[1] // 64
    programs = S_Q * case["q"].shape[1] // 64
    shipped = kernel_module.sparse_mla_fwd_gluon_kernel
    want = traced_call(case, "paged", None)
    with tempfile.TemporaryDirectory() as workdir:
        for name, edits in VARIANTS.items():
            kernel_module.sparse_mla_fwd_gluon_kernel = edited_module(
                kernel_module, edits, f"attn_yield_{name}", workdir).sparse_mla_fwd_gluon_kernel
            trace = torch.zeros(programs, TRACE_ROLES, TRACE_EVENTS, dtype=torch.int64, device=dev)
            out, lse = traced_call(case, "paged", trace)
            same = torch.equal(out, want[0]) and torch.equal(lse, want[1])
            ms = bench(lambda: traced_call(case, "paged", None))
            trace = trace.cpu()
            follows, gap = sm_gaps(trace)
            steps = step_cycles(trace, n_blocks, follows & (gap >= 0))
            tflops = 2 * S_Q * 64 * n_blocks * 64 * 1024 / ms / 1e9
            result[name] = {"ms": ms, "tflops": tflops, "same_outputs": same,
                            "program_cycles": float((trace[:, HEADER, 2] - trace[:, HEADER, 1]).double().median()),
                            "steps": {k: steps[k] for k in STEPS}}
            print(f"== {name}: {tflops:.1f} TFLOP/s, outputs {'equal' if same else 'DIFFER'}, program "
                  f"{result[name]['program_cycles']:.0f} cycles")
            for k in STEPS:
                print(f"  {k:46s} " + " ".join(f"{x:7.0f}" for x in steps[k]))
    kernel_module.sparse_mla_fwd_gluon_kernel = shipped
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_yield.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
