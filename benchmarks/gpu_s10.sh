#!/usr/bin/env bash
# Session 10's GPU runs (docs/reports/gpu-session-2026-12-01-s10.md); files under $OUT.
#   source .devdeps/env.sh && PART=gemm bash benchmarks/gpu_s10.sh   (1 x H200: the Gluon V3 GEMM's tests, experiment)
#   source .devdeps/env.sh && PART=ep bash benchmarks/gpu_s10.sh     (2 x H200: the dispatch/combine benchmark with
#       the combine sweeps, mini-deepep's suite, the multi-GPU tests of the runtime and integration tests)
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
  # the benchmark first (the figure issue 6 hinges on), then the correctness suites; each part writes its own file
  export OMP_NUM_THREADS=2
  OUT="$OUT" timeout 120 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_deepep.py --sweep-sms 132 \
    --sweep-shares 0.375 0.5 0.625 --sweep-dispatch-tiles --sweep-combine-tiles 8x256 --sweep-two-pass 0 1 2 \
    > "$OUT/bench_deepep.txt" 2>&1
  echo "bench rc=$?"
  grep -E "same_|combine bf16|copy|dispatch bf16, fixed rows, (queued|steady)|NCCL all_to_all_single.*steady" "$OUT/bench_deepep.txt"
  timeout 170 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepep/tests --junitxml="$OUT/junit_deepep.xml" \
    > "$OUT/deepep_tests.txt" 2>&1
  echo "deepep tests rc=$?"; tail -3 "$OUT/deepep_tests.txt"
  timeout 170 python3 -m pytest -q -rs -p no:cacheprovider runtime/tests integration_tests -m multigpu \
    --junitxml="$OUT/junit_multigpu.xml" > "$OUT/multigpu.txt" 2>&1
  echo "multigpu rc=$?"; tail -3 "$OUT/multigpu.txt"
else
  gemm
fi
