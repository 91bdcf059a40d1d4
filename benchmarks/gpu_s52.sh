#!/usr/bin/env bash
# Session 52's GPU run (docs/reports/gpu-session-2026-12-05-s52.md; run 1 with DEADLINE=300 skipped mini-flashmla's
# suite, run in a second call); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s52.sh   (1 x H200; tree = main 108fa8f + ring slots of two
#       K steps in the folded masked loop, selectable, not routed: the routed kernels are main's SASS):
#       test_gemm_fp4_e4m3.py (with the new bitwise test of two-step slots; it also runs the check sessions 50-51 owed,
#       a9e60b9's masked register cap); exp_moe_masked_tiles (one step per slot, two unrolled, two in a loop, the
#       candidate route, the candidate on 3 stages); the runtime's core GPU tests (owed since session 50);
#       mini-flashmla's GPU suite (the attention launch's stages per device, owed since session 51);
#       exp_moe_breakdown (session 51's masked variants of the folded loop, never run)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s52
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 100
  script_sides 100 exp_moe_masked_tiles.py tiles new
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 150 && run flashmla_tests 150 $PYTEST packages/mini-flashmla/tests -m "not multigpu" -n 8 \
    --junitxml="$OUT/junit_flashmla.xml"
  fits 100 && script_sides 100 exp_moe_breakdown.py breakdown new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests flashmla_tests runtime_tests
  grep -hE "^\|" "$OUT/tiles_new.txt" "$OUT/breakdown_new.txt"
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
esac
pack_out
