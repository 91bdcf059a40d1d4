"""Experiment (issue 4, session 32): the contiguous MoE kernel's FP4 -> e4m3 conversion with the sign bits stored where
the e4m3 bytes want them, 9 -> 7 SASS instructions per 8 weight values.

Why (docs/reports/deepgemm-moe-fold-128.md, sessions 27-30): the converter partition bounds the contiguous kernel,
and at one GPU's prefill shape (~64 rows per expert) every weight is converted once per call whatever the tile. Its
per-value work is the lever. The shipped conversion (gemm_gluon_fp4_e4m3_kernel._E2M1_TO_E4M3_PTX) takes the
checkpoint's byte order, value i's sign in bit 4i + 3, and moves each sign to bit 7 of its output byte with a shift,
two byte permutes and two AND-ORs. Weights are constant, so their packed words could be stored with the signs
permuted once at load: value i's magnitude stays in bits 4i..4i+2, and the signs of values 0-3 go to bits 7, 15, 23,
31 (one AND-OR puts them in place) and those of values 4-7 to bits 3, 11, 19, 27 (a shift and an AND-OR).

How: the kernel module's PTX constant edited (source_variants), the weights' words permuted in torch, the public
contiguous GEMM on folded weights and activations folded per 128 (the engine's route) timed on both, at
bench_fp4_e4m3_route's layouts (96 experts of 128-1,024 rows, 384 of 32-96). The variant's output must equal the
shipped kernel's bit for bit. The masked (decode) kernel assembles its words from 16-bit pieces 16 values apart, so
this storage does not serve it as it stands; it is not timed here.
Writes $OUT/exp_moe_sign_layout.json.

    cd benchmarks && timeout 200 python3 exp_moe_sign_layout.py
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, rand_fp4_weight_scales  # beside this script
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES, PREFILL_LAYOUTS, scaled_grouped_mm_peer
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_gluon_fp4_e4m3_kernel as kernel_module
from mini_deepgemm.reference import fold_ue8m0_to_128
from source_variants import absolute_imports, edited_module

SIGN_LAYOUT_PTX = '''{
.reg .b32 m, t;
and.b32 m, $2, 0x77777777;
prmt.b32 $0, $3, $4, m;
shr.u32 m, m, 16;
prmt.b32 $1, $3, $4, m;
and.b32 t, $2, 0x80808080;
or.b32 $0, $0, t;
shl.b32 t, $2, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, $1, t;
}'''
# value i's sign bit (4i + 3 in the checkpoint's words) -> its bit in the permuted words
SIGN_TARGET = (7, 15, 23, 31, 3, 11, 19, 27)


def sign_permuted(bq: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 weights (uint8 [..., K / 2], value i of a 32-bit word in bits 4i..4i+3) with every word's sign bits
    moved to SIGN_TARGET, magnitudes in place."""
    w = bq.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = w & 0x77777777
    for i, bit in enumerate(SIGN_TARGET):
        out |= ((w >> (4 * i + 3)) & 1) << bit
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.uint8).view(bq.shape)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result, rows_out = environment(torch.device("cuda")), []
    shipped_kernel = kernel_module.fp4_e4m3_contiguous_kernel
    with tempfile.TemporaryDirectory() as workdir:
        shipped_ptx = kernel_module._E2M1_TO_E4M3_PTX.value.strip()  # the text the edit replaces in the source
        variant = edited_module(kernel_module, [absolute_imports("mini_deepgemm"), (shipped_ptx, SIGN_LAYOUT_PTX)],
                                "moe_sign_layout", workdir).fp4_e4m3_contiguous_kernel
        for groups, rows_range in PREFILL_LAYOUTS:
            for name, N, K in MOE_SHAPES:
                rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N, K, gen, rows_range)
                sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
                folded, a128, bq_signs = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1), sign_permuted(bq)
                d_variant = torch.empty_like(d)

                def call(b, out):
                    G.m_grouped_fp8_fp4_gemm_nt_contiguous(a128, (b, sb), out, layout,
                                                           weight_scale_max=FP4_SCALE_BOUND, folded=folded)

                t = {"shipped": ms(lambda: call(bq, d))}
                kernel_module.fp4_e4m3_contiguous_kernel = variant
                try:
                    t["sign_layout"] = ms(lambda: call(bq_signs, d_variant))
                    call(bq_signs, d_variant)
                finally:
                    kernel_module.fp4_e4m3_contiguous_kernel = shipped_kernel
                call(bq, d)
                used = layout >= 0
                t["scaled_grouped_mm_fp8"] = ms(scaled_grouped_mm_peer(a, ends, groups, N, K))
                flops = 2 * sum(rows) * N * K
                row = {"groups": groups, "name": name, "N": N, "K": K, "rows": sum(rows),
                       "bitwise_equal": bool(torch.equal(d[used], d_variant[used])),
                       **{f"us_{k}": v * 1e3 for k, v in t.items()},
                       **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()},
                       "sign_layout_over_shipped": t["shipped"] / t["sign_layout"]}
                print(json.dumps(row), flush=True)
                rows_out.append(row)
                torch.cuda.empty_cache()
    result["rows"] = rows_out
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_sign_layout.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| experts | GEMM | rows | shipped | sign layout | x | peer | x peer (shipped / sign layout) | bitwise |")
    for r in rows_out:
        peer = r["us_scaled_grouped_mm_fp8"]
        print(f"| {r['groups']} | {r['name']} | {r['rows']} | {r['tflops_shipped']:.0f} TFLOP/s | "
              f"{r['tflops_sign_layout']:.0f} | {r['sign_layout_over_shipped']:.3f} | "
              f"{r['tflops_scaled_grouped_mm_fp8']:.0f} | {peer / r['us_shipped']:.2f} / "
              f"{peer / r['us_sign_layout']:.2f} | {r['bitwise_equal']} |")


if __name__ == "__main__":
    main()
