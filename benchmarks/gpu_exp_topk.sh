#!/usr/bin/env bash
# GPU check of the exact top-k kernel (docs/reports/flashmla-topk-exact.md), under 150 s in all:
# its GPU tests, then bench_topk.py (old vs new at the prefill shape).
#   on the GPU machine, from the repo root:  source .devdeps/env.sh && bash benchmarks/gpu_exp_topk.sh
# Writes two files under $OUT: topk_gpu_log.txt (tests and benchmark output) and bench_topk.json.
set -u
OUT=${OUT:-/tmp/gpu_exp_topk}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LOG="$OUT/topk_gpu_log.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  date -u; git rev-parse --short HEAD 2>/dev/null; } > "$LOG" 2>&1
t0=$SECONDS
timeout -s INT 65 python3 -m pytest -q -rs -p no:cacheprovider -m gpu packages/mini-flashmla/tests/test_topk_exact.py \
  >> "$LOG" 2>&1
tests_rc=$?
t1=$SECONDS
timeout -s INT 80 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json" >> "$LOG" 2>&1
bench_rc=$?
echo "tests rc=$tests_rc ($((t1 - t0)) s), bench rc=$bench_rc ($((SECONDS - t1)) s)" >> "$LOG"
head -4 "$LOG"
grep -E "^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed)" "$LOG" | head -12
tail -n 13 "$LOG"  # the benchmark's summary (or its traceback) and the rc line
