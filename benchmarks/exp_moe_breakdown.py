"""Experiment (issue 4; prepared in session 22, run in session 23; masked variants redone in session 51, not yet run):
where the FP8-MMA MoE kernels' time goes, by removing one part of a K step at a time (exp_flashmla_gluon_breakdown.py's
method).

Why (docs/reports/deepgemm-moe-fold-128.md, session 22): four changes to these kernels measured 0.93-1.01x. The
contiguous kernel (0.81-0.94x `_scaled_grouped_mm`) has its tensor pipe at 45% and its issue slots at 38-44%, and
waits: long-scoreboard and barrier stalls are 51-54% of its working warps' samples. The masked kernel at ~32 rows per
expert (0.37-0.40 of the copy rate) moved neither with more copies in flight nor with fewer loads per step. Which part
each waits on (the FP4 -> e4m3 conversion, the MMAs, the promotion, the copies and their handshakes) decides what to
change next.

How: variants of mini_deepgemm/gemm_gluon_fp4_e4m3_kernel.py, each with one part of the loop removed (its source
edited into a temporary module, so the package keeps one kernel), swapped into the kernel module and called through
the public grouped GEMMs on folded weights and activations folded per 128 (the engine's route):
- contiguous (96 experts of 128-1,024 rows, w13 and w2): `no_convert` (the converter waits for the packed weights and
  hands the slot on without converting them), `no_mma` (the math warps wait for the slot and release it, no MMA),
  `no_fma` (the MMA's tile replaces the accumulator instead of being promoted into it), `handshakes_only` (neither
  conversion nor MMA: the producer's copies and the barriers);
- masked (96 experts, Poisson(8), (32) and (64) rows, the routed tiles: 16 tokens, the split 32 / 64 tokens, 64
  tokens), on the folded loop (`_masked_folded_step`; session 23's edits were of the shared-tile conversion, which
  the folded route left for register A operands in session 26): `no_convert` (the MMAs read the loaded words as
  they are, one XOR per word with its row's offsets keeping their loads), `no_fma` (the MMA's part replaces the
  accumulator: no promotion, no scale loads), `no_mma_no_convert` (no MMA; the conversion that only feeds them goes
  too), `loads_only` (that and no promotion: the ring's copies and waits, and the offsets' loads).
Offline (triton 3.6, sm_90a, every variant compiles): the contiguous variants keep 128 registers per thread (one
persistent CTA per SM either way). The masked ones drop registers (session 51, w13, registers of the 16-token /
split 32-token / 64-token tile, full -> no_convert / no_fma / no_mma_no_convert / loads_only: 118 -> 116 / 93 / 63 /
48; 128 (8 B stack) -> 128 (16 B) / 122 / 106 / 80; 252 -> 252 / 182 / 148 / 96), so some fit more CTAs per SM.
Their times bound the removed part from below; they are not the same kernel minus a part.
Every variant computes garbage; only its time counts (CUDA-graph replay, `exp_gemm_gluon_v3.ms`). The shipped
kernel's rows are checked against the bf16 route first (calc_diff), so the table's "full" is a correct kernel.
Writes $OUT/exp_moe_breakdown.json.

    cd benchmarks && python3 exp_moe_breakdown.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import torch

from bench_deepgemm import (FP4_SCALE_BOUND, MOE_SHAPES, contiguous_operands, masked_operands,  # beside this script
                            rand_fp4_weight_scales)
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_gluon_fp4_e4m3_kernel as kernel_module
from mini_deepgemm.reference import fold_ue8m0_to_128
from mini_deepgemm.testing import calc_diff
from source_variants import absolute_imports, edited_module

# the conversion and its store, in the converter (256-row tiles, per-32 activations) and in the 128-row tiles' two
# feeders (since session 70)
CONVERT_CONTIGUOUS = [(re.compile(r"\n +tile_words = _convert_rows\(raw_words\.index\((slot|s % RAW)\)\.load\("
                                  r"_ROW_WORDS\), offsets\)\n"), "\n"),
                      (re.compile(r"\n +b_ring\.index\(slot\)\.store\(tile_words\)\n"), "\n")]
MMA_CONTIGUOUS = [(re.compile(r"part = warpgroup_mma_wait\(0, deps=\(warpgroup_mma\(\n\s+a_tile, b_tile\.permute\(\(1, "
                              r"0\)\), zero, use_acc=False, is_async=True\),\)\)"), "part = zero"),
                  (re.compile(r"part = warpgroup_mma_wait\(0, deps=\(warpgroup_mma\(\n\s+a_ring\.index\(slot\)\.slice\("
                              r"ROW0 \+ 128, 64, dim=0\), b_tile\.permute\(\(1, 0\)\), zero,\n\s+use_acc=False, "
                              r"is_async=True\),\)\)"), "part = zero")]
FMA_CONTIGUOUS = [("\n                acc = acc + part * wa[:, None]\n", "\n                acc = part\n"),
                  ("\n                acc_1 = acc_1 + part * wa_1[:, None]\n", "\n                acc_1 = part\n")]
# the masked kernel's folded loop (_masked_folded_step, the route on activations folded per 128): the A operand
# straight from the loaded words (one XOR per word with its row's offsets keeps their loads), the two MMAs (which
# also drops the conversion feeding them: an operand no MMA reads is not computed), the promotion (which also drops
# the activation scales' loads)
CONVERT_MASKED = [(
    "    lo, hi = LUT_LO_BASE + offset * LUT_LO_STEP, LUT_HI_BASE + offset * LUT_HI_STEP  # the 32-block's tables\n"
    "    q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, \"=r,=r,r,r,r\", [words, lo, hi],\n"
    "                                         dtype=(gl.int32, gl.int32), is_pure=True, pack=1)\n",
    "    q03, q47 = words, words ^ offsets[:, None]\n")]
MMA_MASKED = [("\n    lo_mma = warpgroup_mma(a_lo, b, zero, use_acc=False, is_async=True)\n", "\n"),
              ("\n    hi_mma = warpgroup_mma(a_hi, b, zero, use_acc=False, is_async=True)\n", "\n"),
              ("\n    part_lo, part_hi = warpgroup_mma_wait(0, deps=(lo_mma, hi_mma))\n",
               "\n    part_lo, part_hi = zero, zero\n")]
FMA_MASKED = [("\n    acc_lo = acc_lo + part_lo * wa[None, :]\n    acc_hi = acc_hi + part_hi * wa[None, :]\n",
               "\n    acc_lo = part_lo\n    acc_hi = part_hi\n")]
VARIANTS = {  # kernel -> variant -> edits of the kernel module's source (str: exactly once; regex: at least once)
    "contiguous": {"full": [], "no_convert": CONVERT_CONTIGUOUS, "no_mma": MMA_CONTIGUOUS, "no_fma": FMA_CONTIGUOUS,
                   "handshakes_only": CONVERT_CONTIGUOUS + MMA_CONTIGUOUS},
    "masked": {"full": [], "no_convert": CONVERT_MASKED, "no_fma": FMA_MASKED, "no_mma_no_convert": MMA_MASKED,
               "loads_only": MMA_MASKED + FMA_MASKED},
}
KERNEL = {"contiguous": "fp4_e4m3_contiguous_kernel", "masked": "fp4_e4m3_masked_kernel"}
MASKED_ROWS = (8, 32, 64)  # Poisson rows per expert: 16-token tiles, the split 32 / 64-token tiles, 64-token tiles


def variant_kernels(workdir: str) -> dict:
    """(kernel, variant) -> the variant's jitted kernel."""
    imports = absolute_imports("mini_deepgemm")
    return {(kind, name): getattr(edited_module(kernel_module, [imports, *edits], f"moe_{kind}_{name}", workdir),
                                  KERNEL[kind])
            for kind, variants in VARIANTS.items() for name, edits in variants.items()}


def cases(gen) -> list[tuple[str, str, object, object]]:
    """(kernel, case name, call, check): the public GEMM at the route bench's shapes on folded operands; check() ->
    calc_diff of the call's valid rows against the bf16 route's."""
    out = []
    for name, N, K in ((n, *MOE_SHAPES[n]) for n in ("w13", "w2")):
        _, layout, _, _, (a, sa), (bq, _), d = contiguous_operands(96, N, K, gen)
        sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
        (bq_route, folded), a128, ref = G.fold_fp4_weights(bq, sb), fold_ue8m0_to_128(a, sa, 1), torch.empty_like(d)

        def call(a128=a128, bq=bq_route, sb=sb, d=d, layout=layout, folded=folded):
            G.m_grouped_fp8_fp4_gemm_nt_contiguous(a128, (bq, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND,
                                                   folded=folded)

        def check(call=call, a=a, sa=sa, bq=bq, sb=sb, d=d, ref=ref, layout=layout):
            call()
            G.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sa), (bq, sb), ref, layout, weight_scale_max=FP4_SCALE_BOUND)
            used = layout >= 0
            return calc_diff(d[used].float(), ref[used].float())

        out.append(("contiguous", name, call, check))
    for expected_m in MASKED_ROWS:
        for name, N, K in ((n, *MOE_SHAPES[n]) for n in ("w13", "w2")):
            _, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            (bq_route, folded), a128 = G.fold_fp4_weights(bq, sb), fold_ue8m0_to_128(a, sa, 1)
            ref = torch.empty_like(d)

            def call(a128=a128, bq=bq_route, sb=sb, d=d, masked_m=masked_m, folded=folded, expected_m=expected_m):
                G.m_grouped_fp8_fp4_gemm_nt_masked(a128, (bq, sb), d, masked_m, expected_m,
                                                   weight_scale_max=FP4_SCALE_BOUND, folded=folded)

            def check(call=call, a=a, sa=sa, bq=bq, sb=sb, d=d, ref=ref, masked_m=masked_m, expected_m=expected_m):
                call()
                G.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (bq, sb), ref, masked_m, expected_m,
                                                   weight_scale_max=FP4_SCALE_BOUND)
                used = torch.arange(d.shape[1], device="cuda")[None, :] < masked_m[:, None]
                return calc_diff(d[used].float(), ref[used].float())

            out.append(("masked", f"~{expected_m} {name}", call, check))
    return out


def main() -> None:
    result, rows = environment(torch.device("cuda")), []
    shipped = {kind: getattr(kernel_module, k) for kind, k in KERNEL.items()}
    with tempfile.TemporaryDirectory() as workdir:
        kernels = variant_kernels(workdir)
        for kind, case, call, check in cases(torch.Generator().manual_seed(0)):
            row = {"kernel": kind, "case": case, "diff_vs_bf16_route": check()}
            for name in VARIANTS[kind]:
                setattr(kernel_module, KERNEL[kind], kernels[(kind, name)])
                try:
                    row[f"{name}_us"] = ms(call) * 1e3
                except Exception as exc:  # noqa: BLE001 - a variant that fails is recorded; the others still run
                    row[f"{name}_error"] = repr(exc)[:300]
                setattr(kernel_module, KERNEL[kind], shipped[kind])
            rows.append(row)
            print(json.dumps(row), flush=True)
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)
    for kind, variants in VARIANTS.items():
        print(f"| {kind} | diff vs bf16 route | {' | '.join(f'{v} us' for v in variants)} |")
        for r in rows:
            if r["kernel"] == kind:
                cells = " | ".join(f"{r[f'{v}_us']:.0f}" if f"{v}_us" in r else "error" for v in variants)
                print(f"| {r['case']} | {r['diff_vs_bf16_route']:.1e} | {cells} |")


if __name__ == "__main__":
    main()
