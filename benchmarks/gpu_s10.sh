#!/usr/bin/env bash
# Session 10's single-GPU runs (docs/reports/gpu-session-2026-12-01-s10.md): the Gluon V3 GEMM's tests and experiment.
#   source .devdeps/env.sh && bash benchmarks/gpu_s10.sh      (files under $OUT)
set -u
OUT=${OUT:-/tmp/gpu_s10}
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
  --junitxml="$OUT/junit_gluon_v3.xml" > "$OUT/pytest_gluon_v3.txt" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_gluon_v3.txt"
(cd benchmarks && timeout 150 python3 exp_gemm_gluon_v3.py > "$OUT/exp_gemm_gluon_v3.txt" 2>&1; echo "exp rc=$?")
tail -11 "$OUT/exp_gemm_gluon_v3.txt"
