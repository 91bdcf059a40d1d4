"""Experiment (issues 4 and 5, session 28 run 4): the SM clock and power under each prefill GEMM and its peer.
Session 28 run 3 found the H200 at its 700 W cap under the dense V3 GEMM (1,485 MHz) and cuBLAS (1,380 MHz), so
that a kernel's throughput there is its energy per FLOP (docs/reports/deepgemm-gluon-v3.md, "Session 28"). This
asks the same of the MoE prefill GEMM (the engine's FP8-MMA route on activations folded per 128) against
torch._scaled_grouped_mm, and of the bf16 cuBLAS matmul that the attention target is set against.

Each case runs back to back for ~3 s while nvidia-smi samples the SM clock, power and the active clock-event
reasons every 50 ms; medians, with the case's time per call and TFLOP/s, and TFLOP/s per SM and MHz (work per clock,
which the cap does not change). Writes $OUT/exp_power_clocks.json and prints a table.

    cd benchmarks && timeout 150 python3 exp_power_clocks.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import torch

from bench_deepgemm import FP4_SCALE_BOUND, contiguous_operands, dense_operands, rand_fp4_weight_scales
from bench_flashmla import environment
from bench_fp4_e4m3_route import scaled_grouped_mm_peer
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128


def _fields() -> str:
    """The query fields; drivers since 535 name the throttle reasons clocks_event_reasons."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        fields = f"clocks.sm,power.draw,{reasons}"
        if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True).returncode == 0:
            return fields
    return "clocks.sm,power.draw,pstate"


FIELDS = _fields()


def sampled(fn, seconds: float = 3.0) -> dict:
    """Calls fn back to back for `seconds` under an nvidia-smi sampler -> time per call and the samples' medians."""
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    calls, t0 = 0, time.perf_counter()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    lines = [line.split(",") for line in smi.communicate()[0].strip().splitlines()][6:]  # after the warm-up
    clocks = [float(f[0]) for f in lines if len(f) == 3]
    power = [float(f[1]) for f in lines if len(f) == 3]
    return dict(us_per_call=start.elapsed_time(end) * 1e3 / calls, samples=len(clocks),
                sm_clock_mhz_median=statistics.median(clocks) if clocks else float("nan"),
                power_w_median=statistics.median(power) if power else float("nan"),
                reasons=sorted({f[2].strip() for f in lines if len(f) == 3}))


def main() -> None:
    cases = {}
    M, N, K = 4096, 5120, 8192
    op = dense_operands(M, N, K)
    one = torch.ones((), device="cuda")
    cases["dense V3 kernel, wo_b (fp8_gemm_nt)"] = (2 * M * N * K, lambda: G.fp8_gemm_nt(*op["v3"], op["d"]))
    cases["cuBLAS per-tensor FP8, wo_b"] = (2 * M * N * K, lambda: torch._scaled_mm(
        op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16))
    gen = torch.Generator().manual_seed(0)
    groups, N13, K13 = 96, 4608, 5120
    rows, layout, ends, _, (a, sa), (bq, _), d = contiguous_operands(groups, N13, K13, gen)
    sb = rand_fp4_weight_scales(groups, N13, K13 // 32, low=118)
    (bq_route, folded), a128 = G.fold_fp4_weights(bq, sb), fold_ue8m0_to_128(a, sa, 1)
    moe_flops = 2 * sum(rows) * N13 * K13
    cases["MoE w13, FP8-MMA route, folded per 128"] = (moe_flops, lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous(
        a128, (bq_route, sb), d, layout, weight_scale_max=FP4_SCALE_BOUND, folded=folded))
    cases["torch._scaled_grouped_mm, w13"] = (moe_flops, scaled_grouped_mm_peer(a, ends, groups, N13, K13))
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    cases["cuBLAS bf16 matmul, 8192^3"] = (2 * 8192**3, lambda: torch.matmul(x, x))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows_out = []
    for name, (flops, fn) in cases.items():
        row = dict(case=name, **sampled(fn))
        row["tflops"] = flops / row["us_per_call"] / 1e6
        row["flop_per_sm_clock"] = row["tflops"] * 1e12 / sms / (row["sm_clock_mhz_median"] * 1e6)
        rows_out.append(row)
        print(row, flush=True)
    meta = dict(environment(torch.device("cuda")), sampler=f"nvidia-smi {FIELDS}, every 50 ms, medians",
                moe=dict(groups=groups, rows=sum(rows)))
    with open(os.path.join(os.environ.get("OUT", "."), "exp_power_clocks.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows_out), f, indent=1)
    print("| case | us per call | TFLOP/s | SM clock (MHz) | power (W) | FLOP per SM and clock | reasons |")
    for r in rows_out:
        print(f"| {r['case']} | {r['us_per_call']:.1f} | {r['tflops']:.0f} | {r['sm_clock_mhz_median']:.0f} | "
              f"{r['power_w_median']:.0f} | {r['flop_per_sm_clock']:.0f} | {' '.join(r['reasons'])} |")


if __name__ == "__main__":
    main()
