"""Experiment (issue 4): the Gluon grouped FP8 x FP4 GEMMs, contiguous (MoE prefill) and masked (MoE decode), with
the weights converted in the MMA's register layout, against the Triton swap-AB kernel, same run.

For each MoE shape (w13 4608 x 5120, w2 5120 x 2304) and routing (96 experts with 128-1,024 rows, as
bench_deepgemm.py; 96 experts with 64 rows, the 1-GPU prefill routing), on the same bf16 activations from the
dequantization pass:
- checks the Gluon output against the Triton kernel's (bitwise, then calc_diff) and, on a small case, against
  the pure-torch reference (the public API on CPU tensors);
- times the GEMM alone for Triton (its shipped tile) and Gluon variants (tile, stages), plus the whole call
  (pass + GEMM, which now routes to Gluon at more than 96 rows per expert) and torch._scaled_grouped_mm (FP8
  rowwise) as the peer.
Runs 4 and 5 of session 9 also timed a variant that overlapped step i's conversion with step i-1's MMAs (removed
from the kernel since: slower, docs/reports/deepgemm-gluon.md).
Writes $OUT/exp_gemm_gluon.json and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch
import triton
import triton.testing

from bench_deepgemm import MOE_SHAPES, copy_bandwidth_gbs  # beside this script
from mini_deepgemm import gemm as G
from mini_deepgemm.testing import calc_diff, contiguous_layout

VARIANTS = [(128, 3), (128, 4), (128, 2), (64, 3), (64, 4)]  # (BLOCK_M, stages)


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def layout_for(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous layout (128-row aligned segments) on the GPU, and its segment ends for torch's grouped GEMMs."""
    layout = contiguous_layout(rows, G.get_m_alignment_for_contiguous_layout())
    ends = torch.tensor([-(-m // 128) * 128 for m in rows]).cumsum(0).to(torch.int32)
    return layout.cuda(), ends.cuda()


def contiguous_operands(rows: list[int], N: int, K: int, gen: torch.Generator):
    """(a, sa, bq, sb, x, layout, ends) of a contiguous-layout FP8 x FP4 GEMM with len(rows) experts: e4m3
    activations with UE8M0 bytes, packed FP4 weights with UE8M0 bytes, x = the bf16 activation pass (FP4 K order),
    and layout_for(rows)."""
    layout, ends = layout_for(rows)
    M, Gn = layout.numel(), len(rows)
    a = torch.randn(M, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa = torch.randint(120, 130, (M, K // 32), device="cuda", dtype=torch.uint8, generator=gen)
    bq = torch.randint(0, 256, (Gn, N, K // 2), dtype=torch.uint8, device="cuda", generator=gen)
    sb = torch.randint(118, 126, (Gn, N, K // 32), dtype=torch.uint8, device="cuda", generator=gen)
    return a, sa, bq, sb, G._dequant_activations(a, sa, True, grouped_layout=layout), layout, ends


def gluon_gemm(x, bq, sb, d, layout, block_m, stages):
    cfg = {"BLOCK_M": block_m, "BLOCK_N": 128, "GLUON_STAGES": stages, "GROUP_M": 8}
    G._gluon_fp4_grouped_gemm(G._CONTIGUOUS, x, bq, sb, d, layout, cfg)


def triton_gemm(x, bq, sb, d, layout, rows_hint, groups):
    cfg = G.default_config(G._CONTIGUOUS, rows_hint, 32, True, n=bq.shape[-2], groups=groups, fp4=True)
    G._swapab_gemm(x, None, bq, sb, d, G._CONTIGUOUS, layout, True, cfg)
    return cfg


def case(name, N, K, rows, result, gen):
    a, sa, bq, sb, x, layout, ends = contiguous_operands(rows, N, K, gen)
    M, Gn = layout.numel(), len(rows)
    real = layout >= 0
    d_tri = torch.zeros(M, N, dtype=torch.bfloat16, device="cuda")
    cfg = triton_gemm(x, bq, sb, d_tri, layout, M, Gn)
    flops = 2 * sum(rows) * N * K
    row = {"N": N, "K": K, "groups": Gn, "rows": sum(rows), "padded_rows": M, "triton_cfg": dict(cfg)}
    t = ms(lambda: triton_gemm(x, bq, sb, d_tri, layout, M, Gn))
    row["triton_gemm_tflops"] = flops / t / 1e9
    row["triton_call_tflops"] = flops / ms(lambda: G._gemm(G._CONTIGUOUS, (a, sa), (bq, sb), d_tri, None, layout, None, True)) / 1e9
    for block_m, stages in VARIANTS:
        key = f"gluon_m{block_m}_s{stages}"
        try:
            d = torch.zeros(M, N, dtype=torch.bfloat16, device="cuda")
            gluon_gemm(x, bq, sb, d, layout, block_m, stages)
            row[key + "_bitwise_equal_triton"] = bool(torch.equal(d[real], d_tri[real]))
            row[key + "_diff_vs_triton"] = calc_diff(d[real].float(), d_tri[real].float())
            row[key + "_padding_untouched"] = bool((d[~real] == 0).all())
            t = ms(lambda: gluon_gemm(x, bq, sb, d, layout, block_m, stages))
            row[key + "_gemm_tflops"] = flops / t / 1e9
        except Exception as exc:  # noqa: BLE001 - a failing variant is a result
            row[key + "_error"] = repr(exc)[:400]
    w8 = torch.randn(Gn, N, K, device="cuda").to(torch.float8_e4m3fn)
    s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(Gn, N, device="cuda") + 0.5
    try:
        t = ms(lambda: torch._scaled_grouped_mm(a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16))
        row["scaled_grouped_mm_fp8_tflops"] = flops / t / 1e9
    except (RuntimeError, ValueError, TypeError) as exc:
        row["scaled_grouped_mm_error"] = repr(exc)[:300]
    result[name] = row
    print(name, {k: (round(v, 1) if isinstance(v, float) and v > 1 else v) for k, v in row.items()}, flush=True)


def reference_check(result, gen):
    """Small case against the pure-torch reference: 3 experts with 77, 0 and 300 rows, N 256, K 512."""
    N, K, rows = 256, 512, [77, 0, 300]
    a, sa, bq, sb, x, layout, _ = contiguous_operands(rows, N, K, gen)
    M = layout.numel()
    d = torch.zeros(M, N, dtype=torch.bfloat16, device="cuda")
    gluon_gemm(x, bq, sb, d, layout, 128, 3)
    ref = torch.zeros(M, N, dtype=torch.bfloat16)  # the public API on CPU tensors runs the pure-torch reference
    G.m_grouped_fp8_fp4_gemm_nt_contiguous((a.cpu(), sa.cpu()), (bq.cpu(), sb.cpu()), ref, layout.cpu())
    ref = ref.cuda()
    real = layout >= 0
    result["reference_check"] = {"diff": calc_diff(d[real].float(), ref[real].float()),
                                 "padding_untouched": bool((d[~real] == 0).all())}
    print("reference_check", result["reference_check"], flush=True)


def masked_case(name, N, K, expected_m, result, gen):
    """bench_deepgemm.py's masked decode case: 96 experts, max 128 rows, Poisson(expected_m) rows (at least 1).
    Triton: the swap-AB kernel with the activations dequantized in the tile. Gluon: the activation pass over the
    used rows, then the kernel, timed as the whole call; "api": the public call (Gluon since session 9's routing;
    runs 8 and 9 of session 9 timed this call as "triton": the swap-AB kernel in run 8, before the routing, and
    already the Gluon kernel in run 9). GB/s = weight bytes / time."""
    Gn, max_m = 96, 128
    cpu = torch.Generator().manual_seed(2)
    masked_m = torch.clamp(torch.poisson(torch.full((Gn,), float(expected_m)), generator=cpu), 1, max_m).int().cuda()
    a = torch.randn(Gn, max_m, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa = torch.randint(120, 130, (Gn, max_m, K // 32), device="cuda", dtype=torch.uint8, generator=gen)
    bq = torch.randint(0, 256, (Gn, N, K // 2), dtype=torch.uint8, device="cuda", generator=gen)
    sb = torch.randint(118, 126, (Gn, N, K // 32), dtype=torch.uint8, device="cuda", generator=gen)
    weight_bytes = bq.numel() + sb.numel()
    base = G.default_config(G._MASKED, expected_m, 32, True, N, Gn, True)
    d_tri = torch.zeros(Gn, max_m, N, dtype=torch.bfloat16, device="cuda")
    triton_call = lambda: G._swapab_gemm(a, sa, bq, sb, d_tri, G._MASKED, masked_m, True, base)  # noqa: E731
    triton_call()  # the swap-AB kernel, activations dequantized in the tile
    api = lambda: G._gemm(G._MASKED, (a, sa), (bq, sb), torch.empty_like(d_tri), None, masked_m, None, True, expected_m=expected_m)  # noqa: E731
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    row = {"N": N, "K": K, "expected_m": expected_m, "rows": int(masked_m.sum()), "weight_bytes": weight_bytes,
           "triton_gbs": weight_bytes / ms(triton_call) / 1e6, "api_gbs": weight_bytes / ms(api) / 1e6}
    for block_m, stages in ((16, 2), (16, 3), (16, 4), (16, 6), (32, 3), (32, 4), (32, 6)):
        if block_m < base["BLOCK_M"]:
            continue
        key = f"gluon_m{block_m}_s{stages}"
        cfg = {**base, "BLOCK_M": block_m, "GLUON": True, "GLUON_STAGES": stages}
        d = torch.zeros_like(d_tri)
        call = lambda: G._launch_swapab(G._MASKED, (a, sa), (bq, sb), d, masked_m, True, cfg)  # noqa: E731
        try:
            call()
            row[key + "_bitwise_equal_triton"] = bool(torch.equal(d[used], d_tri[used]))
            row[key + "_unused_rows_untouched"] = bool((d[~used] == 0).all())
            row[key + "_gbs"] = weight_bytes / ms(call) / 1e6
        except Exception as exc:  # noqa: BLE001 - a failing variant is a result
            row[key + "_error"] = repr(exc)[:400]
    result[name] = row
    print(name, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "python": platform.python_version(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    try:
        reference_check(result, gen)
    except Exception as exc:  # noqa: BLE001
        result["reference_check_error"] = repr(exc)[:400]
        print("reference_check failed", repr(exc)[:400])
    cpu_gen = torch.Generator().manual_seed(1)
    for name, (N, K) in MOE_SHAPES.items():
        case(f"{name}_96x128-1024", N, K, torch.randint(128, 1025, (96,), generator=cpu_gen).tolist(), result, gen)
        case(f"{name}_96x64", N, K, [64] * 96, result, gen)
    result["device_copy_gbs"] = copy_bandwidth_gbs()
    for name, (N, K) in MOE_SHAPES.items():
        for expected_m in (8, 32):
            masked_case(f"masked_{name}_m{expected_m}", N, K, expected_m, result, gen)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_gluon.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
