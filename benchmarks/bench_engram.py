"""The Engram injection (V41_MODEL.md 2.5) on the engine's path, before and after session 79, one run.

One Engram layer at V4.1's widths (hc 4, D 5,120; 24 table rows of 256 per token, so wkv is FP8 [25,600, 6,144];
a table of 200,000 random rows in the checkpoint's format, e4m3 with UE8M0 per 32) in KernelWeights, at 4,096
tokens (a prefill step) and 64 / 256 (decode batches). Per case:
- before: what ops.engram_inject ran until session 79, composed of the same ops: the rows gathered and dequantized
  to bf16 by torch (act_dequant of the stored rows, the reference's path), wkv's quantizer and GEMM (ops.linear),
  the gate as torch ops (ops.engram_gate);
- after: ops.engram_inject as it is (the stored rows straight into wkv, both steps as the kernels of
  layers/engram_kernels.py);
- the parts: wkv's GEMM alone (its activations made beforehand, the floor of both paths); the front (rows to wkv's
  operand) before, by torch ops (ops.engram_operand) and by the kernel; the gate of each path; a device copy of the
  bytes the gate must move (a read of H, the keys and the value, a write of H) with the fused gate's ratio to it;
- the after path's largest difference from the before path's output (max abs, bf16).
Times: triton.testing.do_bench medians (L2 cleared before each call, 5 ms warm-up, 25 ms of repetitions). Writes
JSON to --out (default $OUT/bench_engram.json or ./bench_engram.json) and prints a table.

    python3 benchmarks/bench_engram.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from mini_deepgemm.reference import act_dequant, weight_quant_fp8

from bench_hc import copy_ms, environment, median_ms, rate, write_and_print_table  # beside this file
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

TOKENS = (4096, 256, 64)
TABLE_ROWS = 200_000


def layer_weights(cfg: V41Config, g: torch.Generator) -> ops.KernelWeights:
    """One Engram layer's tensors ("e.*") at cfg's widths, random, in the checkpoint's formats, as the engine holds
    them (KernelWeights folds wkv)."""
    D, hc, n, width = cfg.hidden_size, cfg.hc_mult, cfg.n_engram_orders * cfg.engram_n_heads, cfg.engram_head_dim
    table = torch.randn(TABLE_ROWS, width, generator=g, device="cuda")
    table_q, table_s = ops.per_token_group_quant_fp8(table, 32, "ue8m0")
    wkv = torch.randn((hc + 1) * D, n * width, generator=g, device="cuda") * (n * width) ** -0.5
    wkv, wkv_s = weight_quant_fp8(wkv)
    return ops.KernelWeights({
        "e.embed.weight": table_q, "e.embed.scale": table_s, "e.wkv.weight": wkv, "e.wkv.scale": wkv_s,
        "e.q_weight": (torch.rand(hc, D, generator=g, device="cuda") + 0.5).to(torch.bfloat16),
        "e.k_weight": (torch.rand(hc, D, generator=g, device="cuda") + 0.5).to(torch.bfloat16)})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_engram.json"))
    args = parser.parse_args(argv)
    cfg = V41Config()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = layer_weights(cfg, g)
    hc, D, eps = cfg.hc_mult, cfg.hidden_size, cfg.rms_norm_eps
    qw, kw = w["e.q_weight"], w["e.k_weight"]
    rows = []
    for T in TOKENS:
        H = torch.randn(T, hc, D, generator=g, device="cuda").to(torch.bfloat16)
        row_ids = torch.randint(0, TABLE_ROWS, (T, cfg.n_engram_orders * cfg.engram_n_heads), generator=g,
                                device="cuda")
        v3_form = ops.dense_v3_form(T, w, "e.wkv")
        table, scale = w["e.embed.weight"], w["e.embed.scale"]
        operand = ops.egk.engram_operand(table, scale, row_ids, v3_form)
        kv = ops.quantized_linear(operand, T, w, "e.wkv", v3_form)

        def rows_bf16() -> torch.Tensor:  # the reference's wkv input
            return act_dequant(*ops.engram_operand(table, scale, row_ids, False)).to(torch.bfloat16)

        def before() -> torch.Tensor:
            return ops.engram_gate(H, ops.linear(rows_bf16(), w, "e.wkv"), qw, kw, eps)

        def after() -> torch.Tensor:
            return ops.engram_inject(H, row_ids, w, "e", cfg)

        gate_bytes = 2 * H.numel() * 2 + kv.numel() * 2  # H read and written, keys and value read (bf16)
        row = {"T": T, "wkv_v3_form": v3_form, "gate_bytes": gate_bytes,
               "max_abs_diff": (after().float() - before().float()).abs().max().item(),
               "before_ms": median_ms(before, "cuda"), "after_ms": median_ms(after, "cuda"),
               "gemm_ms": median_ms(lambda: ops.quantized_linear(operand, T, w, "e.wkv", v3_form), "cuda"),
               "front_before_ms": median_ms(lambda: ops.per_token_group_quant_fp8(
                   rows_bf16(), 32, "ue8m0", fold_128=v3_form), "cuda"),
               "front_torch_ms": median_ms(lambda: ops.engram_operand(table, scale, row_ids, v3_form), "cuda"),
               "front_kernel_ms": median_ms(lambda: ops.egk.engram_operand(table, scale, row_ids, v3_form), "cuda"),
               "gate_torch_ms": median_ms(lambda: ops.engram_gate(H, kv, qw, kw, eps), "cuda"),
               "gate_fused_ms": median_ms(lambda: ops.egk.engram_gate_fused(H, kv, qw, kw, eps), "cuda"),
               "gate_copy_ms": copy_ms(gate_bytes, "cuda")}
        row["speedup"] = row["before_ms"] / row["after_ms"]
        row["gate_fused_of_copy"] = row["gate_copy_ms"] / row["gate_fused_ms"]
        row["gate_fused_gbs"] = rate(row["gate_fused_ms"], gate_bytes)
        rows.append(row)
    result = {"environment": environment("cuda"), "config": {"hc": hc, "D": D, "table_rows": TABLE_ROWS,
              "wkv": list(w["e.wkv.weight"].shape)},
              "timing": "triton.testing.do_bench median, warm-up 5 ms, repetitions 25 ms", "rows": rows}
    write_and_print_table("bench_engram", result, args.out, [
        ("tokens", "r"), ("before ms", "r"), ("after ms", "r"), ("x", "r"), ("wkv GEMM ms", "r"),
        ("front before / torch / kernel", "r"), ("gate torch / fused", "r"), ("gate of copy", "r"),
        ("max abs diff", "r")],
        lambda r: [str(r["T"]), f"{r['before_ms']:.4f}", f"{r['after_ms']:.4f}", f"{r['speedup']:.2f}",
                   f"{r['gemm_ms']:.4f}",
                   f"{r['front_before_ms']:.4f} / {r['front_torch_ms']:.4f} / {r['front_kernel_ms']:.4f}",
                   f"{r['gate_torch_ms']:.4f} / {r['gate_fused_ms']:.4f}", f"{r['gate_fused_of_copy']:.2f}",
                   f"{r['max_abs_diff']:.1e}"])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
