#!/usr/bin/env bash
# Session 52's GPU runs (docs/reports/gpu-session-2026-12-05-s52.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s52.sh   (1 x H200; tree = main 108fa8f): the GPU checks
#       sessions 50-51 owed: test_gemm_fp4_e4m3.py (a9e60b9, the masked register cap on the host), mini-flashmla's GPU
#       suite (the attention launch's stages per device), the runtime's core GPU tests; then exp_moe_breakdown.py
#       (session 51's masked variants of the folded loop, never run)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s52
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 100
  run flashmla_tests 150 $PYTEST packages/mini-flashmla/tests -m "not multigpu" -n 8 --junitxml="$OUT/junit_flashmla.xml"
  run runtime_tests 150 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  script_sides 170 exp_moe_breakdown.py breakdown new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests flashmla_tests runtime_tests
  grep -hE "^\|" "$OUT/breakdown_new.txt"
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
esac
pack_out
