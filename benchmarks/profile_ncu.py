"""One call of a hot kernel under Nsight Compute: where each kernel's time goes (issue 4 and 5 reports).

Usage (GPU machine, from benchmarks/): ncu --profile-from-start off ... python3 profile_ncu.py CASE
(gpu_s17.sh wraps it). Each case builds the benchmark's own operands (bench_deepgemm.py, bench_flashmla.py),
calls the routed public entry point three times (JIT compile and warm-up, outside the profiled range), then opens
the profiler range around exactly one more call, so the report holds that call's kernels and nothing else.

Cases (the shapes of the issue's tables):
- v41, v3: dense FP8 GEMM wo_b (N 5,120, K 8,192), M 4,096, V4.1 recipe (1x32 / 32x32 UE8M0) and V3 recipe;
- cublas_fp8: torch._scaled_mm per-tensor at the same shape (the peer: what the tensor-core pipe looks like full);
- moe_w13: grouped FP8 x FP4 contiguous, 96 experts, w13 4,608 x 5,120, 128-1,024 rows each (seed 0);
- masked_w13: grouped FP8 x FP4 masked, 96 experts, Poisson(8) rows, w13, folded conversion (scale bound 128);
- moe_w13_fold128, masked32_w13_fold128: the engine's route since session 21, the FP8-MMA kernels with folded weights
  and activations folded per 128, at moe_w13's shape and at Poisson(32) rows (the masked case below its target);
- masked384_w13_fold128: the same masked route at one GPU's decode (384 experts of ~1 row, capacity 64: batch 64's
  8-token tiles, one program per expert);
- moe_w13_fold128_no_convert, moe_w13_fold128_no_mma: moe_w13_fold128 on exp_moe_breakdown.py's variants of the
  contiguous kernel without the conversion or without the MMAs (garbage outputs; where the rest's time goes);
- sparse_prefill: sparse_mla_fwd_paged, s_q 4,096, h 64, topk 128 window + 512 compressed, 131k context;
- sparse_prefill_bf16: sparse_mla_fwd on the same indices over bf16 rows (the issue's 550 TFLOP/s case);
- sparse_decode: sparse_mla_fwd_paged, batch 64, one query each, same index shape;
- indexer: indexer_scores, 4,096 queries x 65,536 FP4 keys, 32 heads x 128;
- indexer_decode: indexer_scores on the per-query (decode) path, batch 64, 65,536 keys each (bench_flashmla's case);
- MODULE:FACTORY[:ARG...]: the call FACTORY(*ARGS) of a script beside this one returns (an experiment's variant, e.g.
  session 38's exp_moe_converter_sync:profile_call:warp4, commit 0b99c15), for experiments that do not outlive
  their session.
"""

from __future__ import annotations

import importlib
import sys

import torch

import bench_deepgemm as bd  # beside this script
import bench_flashmla as bf
import mini_flashmla
from mini_deepgemm import gemm as G
from mini_deepgemm import reference

WO_B = (4096, 5120, 8192)  # M, N, K


def dense(recipe: str):
    op = bd.dense_operands(*WO_B)
    return lambda: G._gemm(G._DENSE, *op[recipe], op["d"], None, None, None, False)


def cublas_fp8():
    op = bd.dense_operands(*WO_B)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)


def moe_w13():
    _, layout, _, _, a, b, d = bd.contiguous_operands(96, *bd.MOE_SHAPES["w13"], torch.Generator().manual_seed(0))
    return lambda: G._gemm(G._CONTIGUOUS, a, b, d, None, layout, None, True, weight_scale_max=bd.FP4_SCALE_BOUND)


def masked_w13():
    expected_m = 8
    _, masked_m, a, b, d = bd.masked_operands(96, expected_m, *bd.MOE_SHAPES["w13"])
    return lambda: G._gemm(G._MASKED, a, b, d, None, masked_m, None, True, expected_m=expected_m,
                           weight_scale_max=bd.FP4_SCALE_BOUND)


def _fold128(a, b):
    """The FP8-MMA route's operands: folded weights (reordered) and scales, activations folded per 128 (weight scales
    drawn as bench_fp4_e4m3_route does, bytes 118-128, so that they fold)."""
    sb = bd.rand_fp4_weight_scales(*b[1].shape, low=118)
    bq_route, folded = G.fold_fp4_weights(b[0], sb)
    return reference.fold_ue8m0_to_128(*a, 1), (bq_route, sb), folded


def moe_w13_fold128(groups: int = 96, rows_range: tuple[int, int] = (128, 1024)):
    """The contiguous FP8-MMA route on w13: 96 experts of 128-1,024 rows, or (groups=384, rows_range=(32, 96)) one
    GPU's prefill step, where a tile is about half padding."""
    _, layout, _, _, a, b, d = bd.contiguous_operands(groups, *bd.MOE_SHAPES["w13"], torch.Generator().manual_seed(0),
                                                      rows_range)
    a, b, folded = _fold128(a, b)
    return lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, layout, weight_scale_max=bd.FP4_SCALE_BOUND,
                                                          folded=folded)


def moe_w13_fold128_variant(name: str, *shape):
    """moe_w13_fold128 with the contiguous kernel swapped for exp_moe_breakdown's variant `name` (its module is
    written to a folder that lives as long as the process)."""
    import tempfile

    import exp_moe_breakdown as eb
    from mini_deepgemm import gemm_gluon_fp4_e4m3_kernel as kernel_module

    module = eb.edited_module(kernel_module, [eb.absolute_imports("mini_deepgemm"), *eb.VARIANTS["contiguous"][name]],
                              f"moe_contiguous_{name}", tempfile.mkdtemp())
    setattr(kernel_module, eb.KERNEL["contiguous"], getattr(module, eb.KERNEL["contiguous"]))
    return moe_w13_fold128(*shape)


def masked32_w13_fold128():
    expected_m = 32
    _, masked_m, a, b, d = bd.masked_operands(96, expected_m, *bd.MOE_SHAPES["w13"])
    a, b, folded = _fold128(a, b)
    return lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m,
                                                      weight_scale_max=bd.FP4_SCALE_BOUND, folded=folded)


def masked384_w13_fold128():
    _, masked_m, a, b, d = bd.masked_operands(384, 1, *bd.MOE_SHAPES["w13"], max_m=64)
    a, b, folded = _fold128(a, b)
    return lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 1, weight_scale_max=bd.FP4_SCALE_BOUND,
                                                      folded=folded)


def sparse_prefill():
    c = bf.prefill_case(torch.device("cuda"))
    return lambda: mini_flashmla.sparse_mla_fwd_paged(c["q"], c["window_cache"], c["compressed_cache"], c["wid"],
                                                      c["cid"], bf.SCALE, c["sink"])


def sparse_prefill_bf16():
    c = bf.prefill_case(torch.device("cuda"))
    return lambda: mini_flashmla.sparse_mla_fwd(c["q"], c["kv"], c["idx"], bf.SCALE, c["sink"])


def sparse_decode():
    q, window_cache, compressed_cache, wid, cid, sink = bf.decode_case(torch.device("cuda"), 64,
                                                                       torch.Generator(device="cuda").manual_seed(1))
    return lambda: mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, bf.SCALE, sink)


def indexer():
    q, w, cache, visible, rows = bf.indexer_prefill_case(torch.device("cuda"))
    return lambda: mini_flashmla.indexer_scores(q, w, cache, visible, rows)


def indexer_decode():
    q, w, cache, visible, key_rows = bf.indexer_decode_case(torch.device("cuda"), 64)
    return lambda: mini_flashmla.indexer_scores(q, w, cache, visible, key_rows)


CASES = {"v41": lambda: dense("v41"), "v3": lambda: dense("v3"), "cublas_fp8": cublas_fp8, "moe_w13": moe_w13,
         "masked_w13": masked_w13, "moe_w13_fold128": moe_w13_fold128, "masked32_w13_fold128": masked32_w13_fold128,
         "masked384_w13_fold128": masked384_w13_fold128,
         "moe_w13_fold128_no_convert": lambda: moe_w13_fold128_variant("no_convert"),
         "moe_w13_fold128_no_mma": lambda: moe_w13_fold128_variant("no_mma"),
         "moe384_w13_fold128": lambda: moe_w13_fold128(384, (32, 96)),
         "moe384_w13_fold128_no_convert": lambda: moe_w13_fold128_variant("no_convert", 384, (32, 96)),
         "moe384_w13_fold128_no_mma": lambda: moe_w13_fold128_variant("no_mma", 384, (32, 96)),
         "sparse_prefill": sparse_prefill, "sparse_prefill_bf16": sparse_prefill_bf16, "sparse_decode": sparse_decode,
         "indexer": indexer, "indexer_decode": indexer_decode}


def main() -> None:
    (case,) = sys.argv[1:]
    if ":" in case:  # MODULE:FACTORY[:ARG...]: a call built by a script beside this one (an experiment's variant)
        module, factory, *args = case.split(":")
        call = getattr(importlib.import_module(module), factory)(*args)
    else:
        call = CASES[case]()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profile_ncu: {case} profiled")


if __name__ == "__main__":
    main()
