"""Experiment (issue 4): the grouped FP8 x FP4 GEMM (MoE prefill, contiguous layout) on the warp-specialized Gluon
kernel (gemm_gluon_kernel.fp4_contiguous_ws_kernel, shipped in session 13) against the one-warpgroup kernel it
replaced (fp4_grouped_gemm_kernel's contiguous layout), same run, on the same bf16 activations from the pass.

Session 13 run 2 ran this experiment with the kernel still in this file, and with the same structure on the masked
layout too (16- and 32-token tiles, 6 or 10 stages): contiguous 480-488 against 402-419 TFLOP/s, masked 431-469
against 1,109-1,843 GB/s of weights, all bitwise equal (docs/reports/deepgemm-gluon-fp4-ws.md; data under
docs/reports/data/s13-run2/). The masked part was dropped with the move into the package.
Checks: bitwise equality of the two kernels on the MoE shapes, padding rows untouched, and a small case against the
pure-torch reference; times both kernels alone and torch._scaled_grouped_mm (FP8 rowwise) as the peer.
Few rows (--few-rows, session 13): the 1-GPU prefill's routing, 384 experts with 32-96 rows each, which the public
API ran on the swap-AB kernel's 128 x 64 tiles (BLOCK_M = 64) until session 13; the warp-specialized kernel and
the one-warpgroup kernel's 128 x 64 tile against it, bitwise, on the same activations. Session 13 run 5 also timed
the warp-specialized kernel with 64-token tiles (191-196 against 263-267 TFLOP/s at 128 tokens); the launcher's
token-tile argument that allowed it was removed after (commit 9821138 has it).
Consumers (--consumers, session 15 run 1): the 256-row tile split over 4 consumer warpgroups of 64 rows instead
of 2 of 128: 0.98-1.00x, bitwise equal (docs/reports/deepgemm-gluon-fp4-ws.md); the kernel's CONSUMERS parameter
was removed after (commit c500079 has it).
Conversion (--convert): the kernel without and with the folded scale (FOLD_SCALE), at 4 stages, bitwise (the
data's UE8M0 weight bytes are 118-125; the fold is exact up to 128). Session 16 run 1 measured both as edited copies
against the 4-byte form shipped then: the byte-pair form 1.02-1.04x, the folded scale 1.06-1.09x; both are in the
package since. Offline (triton 3.6, sm_90a) the consumers' K-step loop has 347 SASS instructions per warp in the
4-byte form, 300 in pairs and 269 folded (docs/reports/deepgemm-gluon.md).
A hang guard runs first (child process). Writes $OUT/exp_gemm_gluon_fp4_ws.json (few rows:
exp_gemm_gluon_fp4_ws_few_rows.json; conversion: exp_gemm_gluon_fp4_ws_convert.json).

    cd benchmarks && timeout 240 python3 exp_gemm_gluon_fp4_ws.py [--few-rows | --convert]
"""

from __future__ import annotations

import json
import os
import platform
import sys

import torch
import triton

from exp_gemm_gluon import contiguous_operands
from exp_gemm_gluon_v3 import ms, smoke_in_child
from exp_gemm_masked_tiles import print_variant_table
from mini_deepgemm import gemm as G
from mini_deepgemm.testing import calc_diff

ROUTINGS = {"96x128-1024": 96, "192x128-1024": 192}
SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}
SMOKE_S = 120


def ws_gemm(x, bq, sb, d, layout, stages: int = 4, fold: bool = False) -> None:
    G._gluon_fp4_contiguous_ws_gemm(x, bq, sb, d, layout, stages, fold)


def one_warpgroup_gemm(x, bq, sb, d, layout) -> None:
    G._gluon_fp4_grouped_gemm(G._CONTIGUOUS, x, bq, sb, d, layout,
                              {"BLOCK_M": 128, "BLOCK_N": 128, "GLUON_STAGES": 3, "GROUP_M": 8})


def keep(rows: list[dict], row: dict) -> None:
    """A finished case: kept for the JSON, printed at once (a later hang or timeout keeps what ran), and its
    operands' cached blocks released before the next shape."""
    rows.append(row)
    print(row, flush=True)
    torch.cuda.empty_cache()


def write_rows(filename: str, rows: list[dict]) -> None:
    """$OUT/filename: the rows with the run's GPU, versions and timing method."""
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), timing="triton.testing.do_bench_cudagraph median")
    with open(os.path.join(os.environ.get("OUT", "."), filename), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


def smoke(result) -> None:
    """Child process: 3 experts with 77, 0 and 300 rows, N 512, K 512 (more steps than stages), against the
    one-warpgroup kernel (bitwise) and the reference; padding rows untouched."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, sa, bq, sb, x, layout, _ = contiguous_operands([77, 0, 300], 512, 512, gen)
    d = torch.zeros(layout.numel(), 512, dtype=torch.bfloat16, device="cuda")
    ws_gemm(x, bq, sb, d, layout)
    want = torch.zeros_like(d)
    one_warpgroup_gemm(x, bq, sb, want, layout)
    ref = torch.zeros(layout.numel(), 512, dtype=torch.bfloat16)
    G.m_grouped_fp8_fp4_gemm_nt_contiguous((a.cpu(), sa.cpu()), (bq.cpu(), sb.cpu()), ref, layout.cpu())
    real = layout >= 0
    result.put(dict(bitwise_vs_one_warpgroup=bool(torch.equal(d, want)),
                    padding_untouched=bool((d[~real] == 0).all()),
                    diff_vs_reference=calc_diff(d[real].float(), ref.cuda()[real].float())))


def few_rows() -> None:
    """384 experts of 32-96 rows (the 1-GPU prefill's ~64): the swap-AB kernel as routed (its few-rows config),
    against the warp-specialized kernel at 64- and 128-token tiles and the one-warpgroup kernel at 64."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    cpu = torch.Generator().manual_seed(1)
    rows = torch.randint(32, 97, (384,), generator=cpu).tolist()
    out = []
    for name, (N, K) in SHAPES.items():
        a, sa, bq, sb, x, layout, ends = contiguous_operands(rows, N, K, gen)
        real = layout >= 0
        flops = 2 * sum(rows) * N * K
        cfg = G.default_config(G._CONTIGUOUS, layout.numel(), 32, True, N, len(rows), True)
        want = torch.zeros(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
        G._swapab_gemm(x, None, bq, sb, want, G._CONTIGUOUS, layout, True, cfg)
        row = dict(name=name, N=N, K=K, rows=sum(rows), routed_block_m=cfg["BLOCK_M"],
                   routed_gluon=bool(cfg.get("GLUON")))
        row["swapab_tflops"] = flops / ms(lambda: G._swapab_gemm(x, None, bq, sb, want, G._CONTIGUOUS, layout, True,
                                                                 cfg)) / 1e9
        variants = {f"ws_m128_s{st}": (lambda d, st=st: ws_gemm(x, bq, sb, d, layout, st)) for st in (4, 6)}
        variants["one_warpgroup_m64"] = lambda d: G._gluon_fp4_grouped_gemm(
            G._CONTIGUOUS, x, bq, sb, d, layout, {"BLOCK_M": 64, "BLOCK_N": 128, "GLUON_STAGES": 3, "GROUP_M": 8})
        for key, fn in variants.items():
            d = torch.zeros_like(want)
            fn(d)
            row[f"{key}_bitwise"] = bool(torch.equal(d[real], want[real]))
            row[f"{key}_tflops"] = flops / ms(lambda: fn(d)) / 1e9
        keep(out, row)
    write_rows("exp_gemm_gluon_fp4_ws_few_rows.json", out)
    keys = [k[:-7] for k in out[0] if k.endswith("_tflops")]
    print("| shape | " + " | ".join(keys) + " |")
    for r in out:
        print(f"| {r['name']} | " + " | ".join(f"{r[k + '_tflops']:.0f}" + ("" if k == "swapab" or r[k + "_bitwise"]
                                                                           else " (NOT bitwise)") for k in keys) + " |")


def convert() -> None:
    """The shipped kernel with and without the folded scale (FOLD_SCALE), at the prefill routings and the few-rows
    one, bitwise (module docstring)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    cpu = torch.Generator().manual_seed(5)
    routings = {**{k: (g, 128, 1025) for k, g in ROUTINGS.items()}, "384x32-96": (384, 32, 97)}
    out = []
    for routing, (groups, lo, hi) in routings.items():
        rows = torch.randint(lo, hi, (groups,), generator=cpu).tolist()
        for name, (N, K) in SHAPES.items():
            a, sa, bq, sb, x, layout, ends = contiguous_operands(rows, N, K, gen)
            assert int(sb.max()) <= 128, "the folded conversion is exact only for UE8M0 weight bytes <= 128"
            flops = 2 * sum(rows) * N * K
            want = torch.zeros(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
            ws_gemm(x, bq, sb, want, layout)
            row = dict(routing=routing, name=name, N=N, K=K, rows=sum(rows),
                       shipped_tflops=flops / ms(lambda: ws_gemm(x, bq, sb, want, layout)) / 1e9)
            d = torch.zeros_like(want)
            ws_gemm(x, bq, sb, d, layout, fold=True)
            row["fold_tflops"] = flops / ms(lambda: ws_gemm(x, bq, sb, d, layout, fold=True)) / 1e9
            row["fold_bitwise"] = bool(torch.equal(d, want))
            keep(out, row)
    write_rows("exp_gemm_gluon_fp4_ws_convert.json", out)
    print_variant_table(out, ["routing", "name"], "tflops", ["fold"])


def main() -> None:
    if "--convert" in sys.argv:
        print("smoke:", smoke_in_child(smoke, SMOKE_S, "the warp-specialized FP4 kernel's smoke call"), flush=True)
        convert()
        return
    if "--few-rows" in sys.argv:
        print("smoke:", smoke_in_child(smoke, SMOKE_S, "the warp-specialized FP4 kernel's smoke call"), flush=True)
        few_rows()
        return
    print("smoke:", smoke_in_child(smoke, SMOKE_S, "the warp-specialized FP4 kernel's smoke call"), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu = torch.Generator().manual_seed(0)
    rows_out = []
    for routing, groups in ROUTINGS.items():
        rows = torch.randint(128, 1025, (groups,), generator=cpu).tolist()
        for name, (N, K) in SHAPES.items():
            a, sa, bq, sb, x, layout, ends = contiguous_operands(rows, N, K, gen)
            real = layout >= 0
            flops = 2 * sum(rows) * N * K
            want = torch.zeros(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
            one_warpgroup_gemm(x, bq, sb, want, layout)
            row = dict(routing=routing, name=name, N=N, K=K, rows=sum(rows))
            for stages in (3, 4):
                d = torch.zeros_like(want)
                ws_gemm(x, bq, sb, d, layout, stages)
                row[f"ws_s{stages}_bitwise_vs_one_warpgroup"] = bool(torch.equal(d[real], want[real]))
                row[f"ws_s{stages}_padding_untouched"] = bool((d[~real] == 0).all())
                row[f"ws_s{stages}_tflops"] = flops / ms(lambda: ws_gemm(x, bq, sb, d, layout, stages)) / 1e9
            row["one_warpgroup_tflops"] = flops / ms(lambda: one_warpgroup_gemm(x, bq, sb, want, layout)) / 1e9
            w8 = torch.randn(len(rows), N, K, device="cuda").to(torch.float8_e4m3fn)
            s_a, s_b = torch.rand(layout.numel(), device="cuda") + 0.5, torch.rand(len(rows), N, device="cuda") + 0.5
            row["scaled_grouped_mm_fp8_tflops"] = flops / ms(lambda: torch._scaled_grouped_mm(
                a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16)) / 1e9
            keep(rows_out, row)
    write_rows("exp_gemm_gluon_fp4_ws.json", rows_out)
    print("| routing | shape | one warpgroup | WS 3 stages | WS 4 stages | scaled_grouped_mm FP8 | bitwise |")
    for r in rows_out:
        print(f"| {r['routing']} | {r['name']} | {r['one_warpgroup_tflops']:.0f} | {r['ws_s3_tflops']:.0f} | "
              f"{r['ws_s4_tflops']:.0f} | {r['scaled_grouped_mm_fp8_tflops']:.0f} | "
              f"{r['ws_s3_bitwise_vs_one_warpgroup'] and r['ws_s4_bitwise_vs_one_warpgroup']} |")


if __name__ == "__main__":
    main()
