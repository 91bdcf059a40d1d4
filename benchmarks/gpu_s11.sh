#!/usr/bin/env bash
# Session 11's GPU runs (docs/reports/gpu-session-2026-12-01-s11.md); files under $OUT.
#   source .devdeps/env.sh && PART=gemm bash benchmarks/gpu_s11.sh   (1 x H200: the warp-specialized V3 GEMM
#       experiment, then bench_deepgemm's full table in GPU time)
set -u
OUT=${OUT:-/tmp/gpu_s11}
mkdir -p "$OUT"
case "${PART:-gemm}" in
gemm)
  (cd benchmarks && timeout 200 python3 exp_gemm_gluon_v3_ws.py > "$OUT/exp_gemm_gluon_v3_ws.txt" 2>&1; echo "ws exp rc=$?")
  tail -14 "$OUT/exp_gemm_gluon_v3_ws.txt"
  (cd benchmarks && timeout 330 python3 bench_deepgemm.py --graph --out "$OUT" > "$OUT/bench_deepgemm.txt" 2>&1; echo "bench rc=$?")
  tail -45 "$OUT/bench_deepgemm.txt"
  ;;
esac
