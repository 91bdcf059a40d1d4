"""Experiment (issue 4, session 28 run 3): is the V3 kernel's slowdown with every SM busy (run 2,
exp_gemm_v3_occupancy.py: a wo_b tile 1.40x slower on 132 programs than on 66 or fewer) the GPU's clock, or
something the SMs share (L2)? Runs each case back to back for ~3 s while nvidia-smi samples the SM clock, power and
the active clock-throttle reasons every 50 ms, and reports their medians with the case's time per call.

Cases (wo_b, 4,096 x 5,120 x 8,192, V3 operands): the shipped kernel at 128 x 256 tiles on 132 and on 66 programs,
and cuBLAS per-tensor FP8 (torch._scaled_mm). Writes $OUT/exp_gemm_v3_clocks.json and prints a table.

    cd benchmarks && timeout 120 python3 exp_gemm_v3_clocks.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import torch

from bench_deepgemm import dense_operands  # beside this script
from exp_gemm_v3_occupancy import launch

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
    reasons = sorted({f[2].strip() for f in lines if len(f) == 3})
    return dict(us_per_call=start.elapsed_time(end) * 1e3 / calls, samples=len(clocks),
                sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
                power_w_median=statistics.median(power) if power else None, throttle_reasons=reasons)


def main() -> None:
    M, N, K = 4096, 5120, 8192
    op = dense_operands(M, N, K)
    (aq, sa), (bq, sb) = op["v3"]
    d, one = op["d"], torch.ones((), device="cuda")
    cases = {
        "v3_256_132_programs": lambda: launch(aq, sa, bq, sb, d, 256, 132, False),
        "v3_256_66_programs": lambda: launch(aq, sa, bq, sb, d, 256, 66, False),
        "cublas_fp8_tensor": lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16),
    }
    rows = []
    for name, fn in cases.items():
        row = dict(case=name, **sampled(fn))
        row["tflops"] = 2 * M * N * K / row["us_per_call"] / 1e6
        rows.append(row)
        print(row, flush=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                shape=dict(M=M, N=N, K=K), sampler=f"nvidia-smi {FIELDS}, every 50 ms, medians")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_v3_clocks.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print("| case | us per call | TFLOP/s | SM clock (MHz, median) | power (W, median) | throttle reasons |")
    for r in rows:
        print(f"| {r['case']} | {r['us_per_call']:.1f} | {r['tflops']:.0f} | {r['sm_clock_mhz_median']} | "
              f"{r['power_w_median']} | {' '.join(r['throttle_reasons'])} |")


if __name__ == "__main__":
    main()
