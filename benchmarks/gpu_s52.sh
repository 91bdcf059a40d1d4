#!/usr/bin/env bash
# Session 52's GPU runs (docs/reports/gpu-session-2026-12-05-s52.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s52.sh   (1 x H200; tree = main 108fa8f): the GPU checks
#       sessions 50-51 owed: test_gemm_fp4_e4m3.py (a9e60b9, the masked register cap on the host), mini-flashmla's GPU
#       suite (the attention launch's stages per device), the runtime's core GPU tests; then the sm_90 compile tests
#       and the launch test on the GPU machine's triton
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s52
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 100
  run flashmla_tests 150 $PYTEST packages/mini-flashmla/tests -m "not multigpu" -n 8 --junitxml="$OUT/junit_flashmla.xml"
  run runtime_tests 150 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run compile_tests 120 $PYTEST integration_tests/test_compile_sm90_deepgemm.py \
    integration_tests/test_compile_sm90_flashmla.py integration_tests/test_compile_sm90_runtime.py \
    integration_tests/test_kernel_launches.py -n 8 --junitxml="$OUT/junit_compile.xml"
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests flashmla_tests runtime_tests compile_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
esac
pack_out
