#!/usr/bin/env bash
# Session 10's GPU runs (docs/reports/gpu-session-2026-12-01-s10.md); files under $OUT.
#   source .devdeps/env.sh && PART=gemm bash benchmarks/gpu_s10.sh   (1 x H200: the Gluon V3 GEMM's tests, experiment)
#   source .devdeps/env.sh && PART=ep bash benchmarks/gpu_s10.sh     (2 x H200: mini-deepep's suite, the multi-GPU
#       tests, the benchmark with the combine sweeps, the steady-state trace, then PART=gemm on GPU 0)
set -u
OUT=${OUT:-/tmp/gpu_s10}
mkdir -p "$OUT"
gemm() {
  timeout 150 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
    --junitxml="$OUT/junit_gluon_v3.xml" > "$OUT/pytest_gluon_v3.txt" 2>&1
  echo "gluon v3 pytest rc=$?"; tail -3 "$OUT/pytest_gluon_v3.txt"
  (cd benchmarks && timeout 150 python3 exp_gemm_gluon_v3.py > "$OUT/exp_gemm_gluon_v3.txt" 2>&1; echo "exp rc=$?")
  tail -9 "$OUT/exp_gemm_gluon_v3.txt"
}
if [ "${PART:-gemm}" = ep ]; then
  export OMP_NUM_THREADS=2
  BENCH_ARGS="--sweep-sms 132 --sweep-shares 0.375 0.5 0.625 --sweep-dispatch-tiles --sweep-combine-tiles 8x256 4x512 \
--sweep-two-pass 0 2 64" PART=final bash benchmarks/gpu_s7.sh > "$OUT/s7_final.txt" 2>&1
  grep -E "rc=|passed|failed|FAILED|Error" "$OUT/s7_final.txt" | head -12
  grep -E "combine bf16|copy|dispatch bf16, fixed rows, (queued|steady)|NCCL all_to_all_single.*steady" "$OUT/s7_final.txt"
  timeout 100 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_deepep.py --trace-steady 10 \
    --warmup 3 --iters 7 > "$OUT/trace_steady.txt" 2>&1
  grep -E "us per call" "$OUT/trace_steady.txt"
fi
gemm
