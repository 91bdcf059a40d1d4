"""Experiment (issue 4, session 27): the contiguous MoE kernel's per-step scale loads made coalesced.

Why (docs/reports/deepgemm-moe-fold-128.md, "Session 27", run 4's profiles): alone, the conversion side runs at
80% of L2 throughput and the MMA side at 71%, and together they take 1.4x the longer of the two. Besides the TMA
copies (24 KB a step), each K step loads one 4-byte word per weight row (the converter's offset bytes,
[G * N, K / 128], row stride K / 128 words) and one fp32 per token row (the math warpgroups' activation scales,
[M, K / 128]). With a row stride of 160 bytes (K = 5,120) every one of those 256 loads is its own 32-byte sector:
~8 KB of L2 sectors a step beside the copies' 24 KB.

How: the shipped kernel's source with the two loads reading transposed tensors, [K / 128, G * N] and
[K / 128, M], so a step's loads of consecutive rows are consecutive words (an edited copy of the module, as
exp_moe_breakdown.py does). Variants: activation scales transposed, offsets transposed, both. Each reads the same
values, so every used row must be bitwise equal to the shipped kernel's.

Measures (96 experts, 128-1,024 rows each, w13 and w2, CUDA-graph replay, same process): TFLOP/s of the shipped
kernel and of each variant; bitwise comparison. Writes $OUT/exp_moe_coalesced_scales.json.

    cd benchmarks && python3 exp_moe_coalesced_scales.py
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_gluon_fp4_e4m3_kernel as kernel_module
from mini_deepgemm.reference import fold_ue8m0_to_128
from source_variants import absolute_imports, edited_module

SA_T = [("            sa_rows = sa_ptr + gl.minimum(offs_m, M - 1).to(gl.int64) * stride_sa\n",
         "            sa_rows = sa_ptr + gl.minimum(offs_m, M - 1)\n"),
        ("                wa_next = gl.load(sa_rows + gl.minimum(k + 1, num_k - 1))\n",
         "                wa_next = gl.load(sa_rows + gl.minimum(k + 1, num_k - 1) * stride_sa)\n")]
OFFSETS_T = [
    ("def _contiguous_convert(raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M: gl.constexpr):",
     "def _contiguous_convert(raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, offsets_stride,\n"
     "                        GROUP_M: gl.constexpr):"),
    ("            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1)).to(gl.int64) * (K // 128)\n",
     "            row_offsets = offsets_ptr + (g * N + gl.minimum(off_n + rows, N - 1))\n"),
    ("gl.load(row_offsets + gl.minimum(1, num_k - 1))", "gl.load(row_offsets + gl.minimum(1, num_k - 1) * offsets_stride)"),
    ("                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1))\n",
     "                offsets_after = gl.load(row_offsets + gl.minimum(k + 2, num_k - 1) * offsets_stride)\n"),
    ("(_contiguous_convert, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, GROUP_M)),",
     "(_contiguous_convert, (raw_ring, b_ring, ready, raw_ready, offsets_ptr, layout_ptr, M, N, K, offsets_stride,\n"
     "                                 GROUP_M)),"),
    ("                               stride_sa, stride_d, STAGES: gl.constexpr, GROUP_M: gl.constexpr,\n",
     "                               stride_sa, stride_d, offsets_stride, STAGES: gl.constexpr, GROUP_M: gl.constexpr,\n"),
]
VARIANTS = {"sa_transposed": SA_T, "offsets_transposed": OFFSETS_T, "both_transposed": SA_T + OFFSETS_T}


def launch(kernel, variant: str, a128, bq, folded: G.FoldedFP4Scales, d: torch.Tensor, layout: torch.Tensor,
           sa_t: torch.Tensor, offsets_t: torch.Tensor) -> None:
    """gemm._fp4_e4m3_gemm's contiguous launch of the variant kernel, with its transposed operands."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm._backend import sm_count

    (aq, sa), (groups, n, k2) = a128, bq.shape
    m, k = aq.shape
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    sa_arg, stride_sa = (sa_t, m) if "sa" in variant or "both" in variant else (sa, k // 128)
    offsets = offsets_t if "offsets" in variant or "both" in variant else folded.offsets
    extra = {"offsets_stride": groups * n} if "offsets" in variant or "both" in variant else {}
    kernel[(min(-(-m // 128) * (n // 128), sm_count(d.device)),)](
        G._tma_desc(aq, (128, 128)), w_desc, G._tma_desc(d, (64, 128)), d, offsets, sa_arg, folded.column_scales,
        layout, m, n, k, stride_sa, d.stride(0), **extra, STAGES=4, GROUP_M=8, CONSUMER_REGS=200, PRODUCER_REGS=24,
        SA_PER_128=True, num_warps=4, maxnreg=128)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    result = {"environment": environment(torch.device("cuda")), "rows": []}
    imports = absolute_imports("mini_deepgemm")
    with tempfile.TemporaryDirectory() as workdir:
        kernels = {v: edited_module(kernel_module, [imports, *edits], f"moe_coalesced_{v}", workdir)
                   .fp4_e4m3_contiguous_kernel for v, edits in VARIANTS.items()}
        for name, N, K in MOE_SHAPES:
            rows, layout, ends, M, (a, sa), (bq, _), d = contiguous_operands(96, N, K, gen)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            sa_t = a128[1].t().contiguous()
            offsets_t = folded.offsets.reshape(96 * N, K // 128).t().contiguous()
            flops = 2 * sum(rows) * N * K
            row = {"name": name, "N": N, "K": K, "rows": sum(rows)}
            shipped = lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(  # noqa: E731
                a128, (bq, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded)
            shipped()
            row["tflops_shipped"] = flops / ms(shipped) / 1e9
            used = layout >= 0
            for variant, kernel in kernels.items():
                out = torch.empty_like(d)
                call = lambda: launch(kernel, variant, a128, bq, folded, out, layout, sa_t, offsets_t)  # noqa: E731
                call()
                row[f"tflops_{variant}"] = flops / ms(call) / 1e9
                row[f"bitwise_{variant}"] = bool(torch.equal(out[used].view(torch.int16), d[used].view(torch.int16)))
            row["tflops_shipped_again"] = flops / ms(shipped) / 1e9
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_coalesced_scales.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in result["rows"]:
        print(f"== {r['name']}: shipped {r['tflops_shipped']:.0f} / {r['tflops_shipped_again']:.0f} TFLOP/s")
        for variant in VARIANTS:
            print(f"   {variant}: {r[f'tflops_{variant}']:.0f} TFLOP/s, "
                  f"{r[f'tflops_{variant}'] / r['tflops_shipped']:.3f}x shipped, bitwise {r[f'bitwise_{variant}']}")


if __name__ == "__main__":
    main()
