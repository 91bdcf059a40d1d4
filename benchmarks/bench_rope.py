"""The fused in-place RoPE kernel (runtime/src/mini_deepinfer/layers/rope.py) against ops.apply_rope_ (torch), one
run.

Shapes: the engine's five calls per layer at 4,096 tokens (a prefill step): q and the attention output's inverse
[T, 64, 512], the window kv [T, 512], the indexer's queries [T, 64, 128], and 2,048 index keys [G, 128] (a ratio-2
layer's new keys); q at 64 tokens (a decode batch). bf16, V4.1-Flash's YaRN frequencies, positions near 131,072.
Per op: the median ms (triton.testing.do_bench, 5 ms warm-up, 25 ms of repetitions, L2 cleared before each call),
GB/s over the bytes it must move (one read and one write of the rotated dims), the same bytes moved by a torch
device copy in the same run (bench_hc.copy_ms) and the fraction of rotated values equal to torch's. Writes JSON to
--out (default $OUT/bench_rope.json or ./bench_rope.json) and prints a table.

    python3 benchmarks/bench_rope.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from bench_hc import copy_ms, environment, median_ms, rate, write_and_print_table  # beside this file
from mini_deepinfer.layers import rope as ropef
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_rope.json"))
    args = parser.parse_args(argv)
    cfg = V41Config()
    shapes = {"q, prefill": (4096, cfg.num_attention_heads, cfg.head_dim), "kv, prefill": (4096, cfg.head_dim),
              "indexer queries, prefill": (4096, cfg.index_n_heads, cfg.index_head_dim),
              "index keys, prefill": (2048, cfg.index_head_dim),
              "q, decode": (64, cfg.num_attention_heads, cfg.head_dim)}
    freqs = ops.rope_freqs(cfg, cfg.layer_role(2)).cuda()
    d_rot = 2 * freqs.shape[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, shape in shapes.items():
        x = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
        pos = torch.randint(126_976, 131_072, (shape[0],), generator=g, device="cuda")
        n_bytes = 2 * x[..., -d_rot:].numel() * x.element_size()
        got = ropef.rope_fused_(x.clone(), pos, freqs)[..., -d_rot:]
        equal = (got == ops.apply_rope_(x.clone(), pos, freqs)[..., -d_rot:]).float().mean().item()
        torch_ms = median_ms(lambda: ops.apply_rope_(x, pos, freqs), "cuda")
        fused_ms = median_ms(lambda: ropef.rope_fused_(x, pos, freqs), "cuda")
        copy = copy_ms(n_bytes, "cuda")
        rows.append({"name": name, "shape": list(shape), "bytes": n_bytes, "torch_ms": torch_ms, "fused_ms": fused_ms,
                     "copy_ms": copy, "fused_gbs": rate(fused_ms, n_bytes), "fused_of_copy": copy / fused_ms,
                     "speedup": torch_ms / fused_ms, "equal_fraction": equal})
    result = {"environment": environment("cuda"), "dtype": "bfloat16", "rotated_dims": d_rot,
              "timing": "triton.testing.do_bench median, warm-up 5 ms, repetitions 25 ms", "rows": rows}
    write_and_print_table("bench_rope", result, args.out, [
        ("call", "l"), ("shape", "l"), ("torch ms", "r"), ("fused ms", "r"), ("x torch", "r"), ("fused GB/s", "r"),
        ("of copy", "r"), ("equal", "r")], lambda r: [
        r["name"], str(r["shape"]), f"{r['torch_ms']:.4f}", f"{r['fused_ms']:.4f}", f"{r['speedup']:.2f}",
        f"{r['fused_gbs']:.0f}", f"{r['fused_of_copy']:.2f}", f"{100 * r['equal_fraction']:.3f}%"])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
