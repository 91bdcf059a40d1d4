#!/usr/bin/env bash
# Session 30's GPU runs (docs/reports/gpu-session-2026-12-03-s30.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s30.sh   (1 x H200, tree = main with the contiguous
#       FP8-MMA MoE kernel's second warpgroup skipping all-padding halves (7890bbc); .ab-base.tar.gz = cce154a: the
#       mini-deepgemm and mini-flashmla GPU suites; the runtime's core GPU tests; bench_prefill and
#       bench_fp4_e4m3_route on both sides)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s30
case "${PART:-r1}" in
r1)
  run deepgemm_tests 140 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run flashmla_tests 90 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 45 new base
  route_sides 50 new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(moe experts) " "$OUT/prefill_new.txt" "$OUT/prefill_base.txt"
  grep -E "^\| " "$OUT/route_new.txt" "$OUT/route_base.txt" | cut -c1-200 | head -24
  ;;
esac
pack_out
