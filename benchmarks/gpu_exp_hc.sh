#!/usr/bin/env bash
# GPU check of the split-K hyper-connection mix kernels (docs/reports/runtime-hc-mix-splitk.md), ~120 s in all:
# the GPU tests of test_hyper_connections.py, then bench_hc.py (sweep of tilings, old tiling vs new, torch peers,
# GB/s vs a device copy). On the GPU machine, from the repo root:
#   source .devdeps/env.sh && bash benchmarks/gpu_exp_hc.sh
# Two files under $OUT: hc_gpu.log (environment, test and benchmark output) and bench_hc.json.
set -u
OUT=${OUT:-/tmp/gpu_exp_hc}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LOG=$OUT/hc_gpu.log
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, sys
print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  date -u; git rev-parse --short HEAD 2>/dev/null; } > "$LOG" 2>&1
t0=$SECONDS
timeout -s INT 50 python3 -m pytest -v -s -rs -p no:cacheprovider -m gpu runtime/tests/test_hyper_connections.py \
  >> "$LOG" 2>&1
echo "== tests rc=$? ($((SECONDS - t0)) s of 50)" >> "$LOG"
t0=$SECONDS
timeout -s INT 65 python3 benchmarks/bench_hc.py --out "$OUT/bench_hc.json" >> "$LOG" 2>&1
echo "== bench rc=$? ($((SECONDS - t0)) s of 65)" >> "$LOG"
head -4 "$LOG"
grep -E "^== |FAILED|Error|passed|failed" "$LOG" | grep -v "^runtime.*PASSED" | tail -10
worst=$(grep -oE "max abs error vs the reference: [0-9.e+-]+" "$LOG" | awk '{print $NF}' | sort -g | tail -1)
echo "worst mixes error in the tests: $worst (bar 1e-5)"
sed -n '/^bench_hc:/,$p' "$LOG" | cut -c1-400
