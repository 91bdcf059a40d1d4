#!/usr/bin/env bash
# GPU check of the fused MoE glue kernels (runtime/src/mini_deepinfer/layers/moe_kernels.py): the GPU tests of
# test_moe_kernels.py and test_moe_grouped.py, then bench_moe_glue.py (old torch chain vs kernels per piece, the
# swiglu tiling sweep, GB/s vs a device copy). On the GPU machine, from the repo root:
#   source .devdeps/env.sh && bash benchmarks/gpu_exp_moe_glue.sh
# Two files under $OUT: moe_glue_gpu.log (environment, test and benchmark output) and bench_moe_glue.json.
set -u
OUT=${OUT:-/tmp/gpu_exp_moe_glue}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
LOG=$OUT/moe_glue_gpu.log
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, sys
print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  date -u; git rev-parse --short HEAD 2>/dev/null; } > "$LOG" 2>&1
t0=$SECONDS
timeout -s INT 240 python3 -m pytest -v -s -rs -p no:cacheprovider -m gpu runtime/tests/test_moe_kernels.py \
  runtime/tests/test_moe_grouped.py >> "$LOG" 2>&1
echo "== tests rc=$? ($((SECONDS - t0)) s of 240)" >> "$LOG"
t0=$SECONDS
timeout -s INT 240 python3 benchmarks/bench_moe_glue.py --sweep --out "$OUT/bench_moe_glue.json" >> "$LOG" 2>&1
echo "== bench rc=$? ($((SECONDS - t0)) s of 240)" >> "$LOG"
head -4 "$LOG"
grep -E "^== |FAILED|Error|passed|failed" "$LOG" | grep -v "^runtime.*PASSED" | tail -12
grep -E "swiglu_weight_quant vs torch chain|moe_grouped kernels vs" "$LOG" | sort | uniq -c | sort -rn | head -12
sed -n '/^bench_moe_glue:/,$p' "$LOG" | cut -c1-400
