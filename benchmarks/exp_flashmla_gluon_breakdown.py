"""Experiment (issue 5): where a 64-slot block's time goes in the Gluon sparse-attention kernel.

Session 11 ran it twice: on the first, single-partition kernel (commit 9b9c405's text; the edits of this file's
first version) and on the warp-specialized one (these edits). docs/reports/flashmla-gluon.md has both. Session 12
run 1 timed a candidate (the softmax's row sums reduced once after the walk; 0.97x per block) that the kernel
then took.

Builds variants of mini_flashmla/sparse_attn_gluon_kernel.py with one part of the block step removed (by editing
its source text into a temporary module, so the package keeps one kernel), and times each through the public API at
bench_flashmla's prefill shape (s_q 4096, h 64, 128 window + 512 compressed slots, 131k context), bf16 rows and the
paged FP8/FP4 cache (session 66 added the variants without the quantized producer's staging copies). The variants
compute garbage; only their time matters. Per-block time = t x SMs / (s_q x 10).
Writes $OUT/exp_flashmla_gluon_breakdown.json.

    cd benchmarks && python3 exp_flashmla_gluon_breakdown.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import mini_flashmla
import mini_flashmla.sparse_attn_gluon_kernel as kernel_module
import torch
from bench_flashmla import S_Q, SCALE, TOPK_C, W, bench, environment, prefill_case
from source_variants import edited_module

# bf16 rows: the tile's copy removed (first, while its text is the kernel's); quantized rows: the staging copies
# masked off (they copy zeros)
GATHER = [(re.compile(r"async_copy.async_copy_global_to_shared\(tiles.index\(t\),.*?\[:, None\]\)\n", re.S), "pass\n"),
          (re.compile(r"mask=\(rows >= 0\)\[:, None\]"), "mask=(rows >= 0)[:, None] & False")]
# quantized rows: the chunks' conversion and tile stores (the copies into the staging buffers stay)
DEQUANT = [(re.compile(r"_dequant_chunk\(words, scales, tiles.*?FORMAT\)\n", re.S), "pass\n")]
# quantized rows: the staging copies themselves (session 66: does the cp.async path's shared-memory traffic, issue
# and fill, hold the producer?): the values' and scales' copies, or the scales' alone (a word a thread, each
# row's bytes once, since session 67; before, the word a thread's groups need)
VALUE_COPIES = [(re.compile(r"async_copy.async_copy_global_to_shared\(values, .*?\[:, None\]\)\n", re.S), "pass\n")]
SCALE_COPIES = [(re.compile(r"async_copy.async_copy_global_to_shared\(scales, .*?\[:, None\]\)\n", re.S), "pass\n")]
QK_MMA = [(re.compile(r"return warpgroup_mma\(q, tile.permute.*?\)\n"), "return zero\n")]
PV_MMA = [(re.compile(r"return warpgroup_mma\(p, tile_half, acc, is_async=True\)"), "return acc")]
VARIANTS = {  # name -> edits of the kernel source (regex, replacement)
    "full": [],
    "no_gather": GATHER,
    "no_dequant": DEQUANT,
    "no_copies": VALUE_COPIES + SCALE_COPIES,
    "no_scale_copies": SCALE_COPIES,
    "no_qk_mma": QK_MMA,
    "no_pv_mma": PV_MMA,
    "no_mma": QK_MMA + PV_MMA,
    "mma_only": GATHER + DEQUANT,  # the consumers alone: the producer only hands over tiles
}
QUANTIZED_ONLY = {"no_dequant", "no_copies", "no_scale_copies"}  # variants of the quantized producer's work


def variant_kernel(name: str, workdir: str):
    return edited_module(kernel_module, VARIANTS[name], f"attn_variant_{name}", workdir).sparse_mla_fwd_gluon_kernel


def main() -> None:
    dev = torch.device("cuda")
    result = environment(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    c = prefill_case(dev)
    cases = {"bf16": lambda: mini_flashmla.sparse_mla_fwd(c["q"], c["kv"], c["idx"], SCALE, c["sink"]),
             "paged": lambda: mini_flashmla.sparse_mla_fwd_paged(c["q"], c["window_cache"], c["compressed_cache"],
                                                                 c["wid"], c["cid"], SCALE, c["sink"])}
    blocks = S_Q * (W + TOPK_C) // 64
    shipped = kernel_module.sparse_mla_fwd_gluon_kernel
    with tempfile.TemporaryDirectory() as workdir:
        for name in VARIANTS:
            kernel_module.sparse_mla_fwd_gluon_kernel = variant_kernel(name, workdir)
            for case, fn in cases.items():
                if name in QUANTIZED_ONLY and case == "bf16":
                    continue
                try:
                    t = bench(fn)
                    result[f"{case}_{name}_ms"] = t
                    result[f"{case}_{name}_us_per_block"] = t * 1e3 * sms / blocks
                except Exception as exc:
                    result[f"{case}_{name}_error"] = repr(exc)[:300]
    kernel_module.sparse_mla_fwd_gluon_kernel = shipped
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_gluon_breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)
    for k, v in result.items():
        if "per_block" in k or "error" in k:
            print(f"{k:40s} {v if isinstance(v, str) else f'{v:.3f}'}")


if __name__ == "__main__":
    main()
