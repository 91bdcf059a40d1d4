"""Experiment (issue 5, session 32): the indexer's 32-head sum as a second MMA, the epilogue in packed bf16.

Why (docs/reports/flashmla-indexer.md): the score kernel is bound by its epilogue, not its MMA. Per (key, query, head)
element it rounds the fp32 dot product to bf16 and back, applies relu, multiplies by the head weight in fp32, rounds to
bf16 and back, and then sums 32 heads per query across lanes (`tl.sum` over a reshape). That is ~7 instructions per
element beside 2 x 128 MMA FLOPs; session 29's Gluon kernel lost for the same reason.

How (a source edit of `_score_tile`, loaded as a temporary module; the kernels around it unchanged):
- the dot product is rounded to bf16 by the packed convert (two values per instruction);
- relu and the weight multiply run as `max.bf16x2` and `mul.rn.bf16x2`: the product of two bf16 values is exact in
  fp32, so bf16(relu x w) rounded once is the reference's bf16(fp32(relu) x fp32(w));
- the head sum is an MMA: P [keys, (query, head)] (bf16, in the first MMA's accumulator registers, which are already
  the second MMA's A fragment) times a 0/1 matrix [(query, head), 16] with column j = query j. Every product is x 1.0,
  exact, so only the summation order differs from the reference's fp32 sum, as in the shipped kernel.
The first MMA's M side must stay in the warpgroup that holds P, so 128-key tiles run on 8 warps and 64-key tiles on 4
(Triton lays an M = 64 MMA on 8 warps as two N halves).

Measured at bench_flashmla's prefill shape (4,096 queries x 32 heads x 128 against 65,536 keys) beside the shipped
launch and the cuBLAS FP8 peer; decode's per-query kernel at batch 64 / 256 (the same `_score_tile` at one query).
Every variant's scores are compared with the shipped kernel's and, on 64 queries, with the reference.
Writes $OUT/exp_indexer_mma_headsum.json.

    cd benchmarks && timeout 300 python3 exp_indexer_mma_headsum.py
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import torch

from bench_flashmla import INDEX_DIM as D
from bench_flashmla import INDEX_HEADS as N_HEADS
from bench_flashmla import (N_COMPRESSED, S_Q, bench, bench_graph, environment, indexer_peer_ms,  # beside this script
                            indexer_prefill_case)
from mini_deepgemm._backend import sm_count
from mini_deepgemm.reference import fp4_fakequant
from mini_flashmla import api, reference
from mini_flashmla import indexer_kernel as kernel_module
from mini_flashmla.cache_layout import pack_index_k_fp4
from source_variants import edited_module

SHIPPED_SCORE_TILE = '''    s = tl.dot(k, tl.trans(q)).to(tl.bfloat16).to(tl.float32)  # [BLOCK_K, BLOCK_Q * H], per-head bf16 rounding
    prod = (tl.maximum(s, 0.0) * w[None, :]).to(tl.bfloat16).to(tl.float32)
    return tl.sum(tl.reshape(prod, [k.shape[0], BLOCK_Q, H]), 2).to(tl.bfloat16).to(tl.float32)
'''
MMA_SCORE_TILE = '''    s = tl.dot(k, tl.trans(q)).to(tl.bfloat16)  # [BLOCK_K, BLOCK_Q * H], per-head bf16 rounding
    wb = tl.broadcast_to(w.to(tl.bfloat16)[None, :], s.shape)
    prod = tl.inline_asm_elementwise(
        "{ .reg .b32 z, r; mov.b32 z, 0; max.bf16x2 r, $1, z; mul.rn.bf16x2 $0, r, $2; }", "=r,r,r", [s, wb],
        dtype=tl.bfloat16, is_pure=True, pack=2)
    j = tl.arange(0, 16)
    heads_of = ((tl.arange(0, BLOCK_Q * H) // H)[:, None] == j[None, :]).to(tl.bfloat16)  # [BLOCK_Q * H, 16]
    total = tl.dot(prod, heads_of)  # [BLOCK_K, 16]: column j = query j's head sum (0 for j >= BLOCK_Q)
    total = tl.sum(tl.reshape(total, [k.shape[0], 16 // BLOCK_Q, BLOCK_Q]), 1)  # + exact zeros
    return total.to(tl.bfloat16).to(tl.float32)
'''


def variant_module(workdir: str):
    return edited_module(kernel_module, [(SHIPPED_SCORE_TILE, MMA_SCORE_TILE)],
                         "indexer_kernel_mma_headsum", workdir)


def shared_launch(kernel, case, out, block_q, block_k, num_warps, num_stages, programs_per_sm):
    q, w, cache, visible, rows = case
    key_tiles, query_tiles = math.ceil(N_COMPRESSED / block_k), math.ceil(S_Q / block_q)
    queries_per_program = block_q * max(1, min(64, key_tiles * query_tiles // (programs_per_sm * sm_count(q.device))))
    kernel[(key_tiles, math.ceil(S_Q / queries_per_program))](
        q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], rows, 0, visible, out, out.stride(0),
        S_Q, N_COMPRESSED, queries_per_program, H=N_HEADS, D=D, BLOCK_Q=block_q, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)


def record(row: dict, call, out: torch.Tensor, want: torch.Tensor, timer, ref: torch.Tensor | None = None) -> dict:
    try:
        out.fill_(7.0)
        call()
        row["mismatches_vs_shipped"] = int((out != want).sum())
        row["max_abs_vs_shipped"] = float((out - want).nan_to_num(0.0).abs().max())
        if ref is not None:
            row["mismatches_vs_reference_64q"] = int((out[:64] != ref).sum())
        row["ms"] = timer(call)
    except Exception as exc:  # noqa: BLE001 - a launch that fails is recorded; the sweep goes on
        row["error"] = repr(exc)[:300]
    print(json.dumps(row), flush=True)
    return row


def prefill(variant, result: dict) -> list:
    dev = torch.device("cuda")
    case = indexer_prefill_case(dev)
    q, w, cache, visible, rows = case
    shipped = api.indexer_scores(*case)
    ref = reference.indexer_scores_paged_ref(q[:64], w[:64], cache, visible[:64], rows)
    result["shipped_ms"] = bench(lambda: api.indexer_scores(*case))
    result["shipped_mismatches_vs_reference_64q"] = int((shipped[:64] != ref).sum())
    result["fp8_scaled_mm_ms"] = indexer_peer_ms(dev, N_HEADS, D)
    out, rows_out = torch.empty_like(shipped), []
    configs = [("shipped_kernel", 4, 64, 8, 3, 4), ("shipped_kernel", 4, 128, 8, 3, 4)]
    configs += [("mma_headsum", 4, bk, nw, st, 4) for bk, nw in ((128, 8), (64, 4)) for st in (1, 2, 3)]
    configs += [("mma_headsum", 8, 128, 8, st, 4) for st in (1, 2)]
    configs += [("mma_headsum", 4, 128, 4, 1, 4), ("mma_headsum", 4, 64, 8, 2, 4), ("mma_headsum", 4, 128, 8, 1, 8)]
    configs += [("mma_headsum", 4, 128, 4, 1, pps) for pps in (2, 8, 16)] + [("mma_headsum", 4, 128, 4, 2, 4)]
    configs += [("mma_headsum", 4, 256, 8, 1, 4), ("mma_headsum", 2, 128, 4, 1, 4), ("mma_headsum", 4, 256, 4, 1, 4)]
    for name, bq, bk, nw, st, pps in configs:
        kernel = (kernel_module if name == "shipped_kernel" else variant).indexer_scores_kernel
        row = dict(kernel=name, block_q=bq, block_k=bk, num_warps=nw, num_stages=st, programs_per_sm=pps)
        rows_out.append(record(row, lambda: shared_launch(kernel, case, out, bq, bk, nw, st, pps), out, shipped,
                               bench, ref))
    return rows_out


def per_query(variant) -> list:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    rows_out = []
    for batch in (64, 256):
        q = fp4_fakequant(torch.randn(batch, N_HEADS, D, device=dev, generator=g), 32, "ue8m0").bfloat16()
        w = (torch.randn(batch, N_HEADS, device=dev, generator=g) * 0.02).bfloat16()
        cache = pack_index_k_fp4(torch.randn(batch * N_COMPRESSED // 8, D, device=dev, generator=g)).repeat(8, 1)
        key_rows = (torch.arange(batch, device=dev, dtype=torch.int32)[:, None] * N_COMPRESSED
                    + torch.arange(N_COMPRESSED, device=dev, dtype=torch.int32)[None, :])
        visible = torch.full((batch,), N_COMPRESSED, dtype=torch.int64, device=dev)
        shipped = api.indexer_scores(q, w, cache, visible, key_rows)
        out = torch.empty_like(shipped)
        sms = sm_count(dev)
        for name, module in (("shipped_kernel", kernel_module), ("mma_headsum", variant)):
            for block_k, num_warps in ((128, 4), (128, 8)):
                tiles = max(1, min(64, math.ceil(N_COMPRESSED / block_k) * batch // (4 * sms)))

                def call(module=module, block_k=block_k, num_warps=num_warps, tiles=tiles):
                    module.indexer_scores_per_query_kernel[(batch, math.ceil(N_COMPRESSED / (block_k * tiles)))](
                        q, q.stride(0), q.stride(1), w, w.stride(0), cache, cache.shape[0], key_rows,
                        key_rows.stride(0), key_rows, key_rows.stride(0), visible, out, out.stride(0), N_COMPRESSED,
                        N_COMPRESSED, block_k * tiles, H=N_HEADS, D=D, BLOCK_K=block_k, STAGES=1, ASM=True, GROUP=0,
                        num_warps=num_warps)

                row = dict(batch=batch, kernel=name, block_k=block_k, num_warps=num_warps,
                           key_bytes=batch * N_COMPRESSED * 68)
                rows_out.append(record(row, call, out, shipped, bench_graph))
        torch.cuda.empty_cache()
    return rows_out


def main() -> None:
    result = environment(torch.device("cuda"))
    with tempfile.TemporaryDirectory() as workdir:
        variant = variant_module(workdir)
        result["prefill"] = prefill(variant, result)
        torch.cuda.empty_cache()
        result["per_query"] = per_query(variant)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_indexer_mma_headsum.json"), "w") as f:
        json.dump(result, f, indent=1)
    peer = result["fp8_scaled_mm_ms"]
    print(f"shipped {result['shipped_ms']:.3f} ms = {peer / result['shipped_ms']:.3f}x FP8 scaled_mm ({peer:.3f} ms); "
          f"vs reference (64 queries): {result['shipped_mismatches_vs_reference_64q']} mismatches")
    print("| kernel | block_q | block_k | warps | stages | programs/SM | ms | x shipped | x scaled_mm | "
          "mismatches vs shipped | vs reference (64 q) |")
    for r in sorted((r for r in result["prefill"] if "ms" in r), key=lambda r: r["ms"]):
        print(f"| {r['kernel']} | {r['block_q']} | {r['block_k']} | {r['num_warps']} | {r['num_stages']} | "
              f"{r['programs_per_sm']} | {r['ms']:.3f} | {result['shipped_ms'] / r['ms']:.2f} | {peer / r['ms']:.2f} | "
              f"{r['mismatches_vs_shipped']} | {r['mismatches_vs_reference_64q']} |")
    print("| batch | kernel | block_k | warps | ms | key GB/s | mismatches vs shipped |")
    for r in (r for r in result["per_query"] if "ms" in r):
        print(f"| {r['batch']} | {r['kernel']} | {r['block_k']} | {r['num_warps']} | {r['ms']:.3f} | "
              f"{r['key_bytes'] / r['ms'] / 1e6:.0f} | {r['mismatches_vs_shipped']} |")


if __name__ == "__main__":
    main()
