#!/usr/bin/env bash
# Session 39's GPU runs (docs/reports/gpu-session-2026-12-04-s39.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s39.sh   (1 x H200, tree = main: the mini-deepgemm GPU
#       suite and bench_fp4_e4m3_route after session 38's unrun mends (731a227, 98f7830, bc40823))
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s39
case "${PART:-r1}" in
r1)
  run deepgemm_tests 170 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  route_sides 90 new
  cat "$OUT/summary.txt"; test_summary deepgemm_tests
  grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' "$OUT/route_new.txt" \
    | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  ;;
esac
pack_out
