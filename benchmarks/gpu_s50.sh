#!/usr/bin/env bash
# Session 50's GPU runs (docs/reports/gpu-session-2026-12-05-s50.md); files under $OUT, packed by pack_out.
# Run 1 was gpu_s49.sh PART=r4 on main (the suites session 49 owed).
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s50.sh   (1 x H200; tree = main + the split masked tiles,
#       gemm._masked_launches): the FP8-MMA MoE kernels' tests; exp_moe_masked_tiles (96 experts at ~16 / 32 / 64
#       rows: one launch of T or 2T tokens against the split); the runtime's MoE GPU tests
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s50
case "${PART:-r2}" in
r2)
  fp4_e4m3_tests 100
  script_sides 200 exp_moe_masked_tiles.py tiles new
  run moe_tests 90 $PYTEST runtime/tests/test_moe_grouped.py runtime/tests/test_moe_kernels.py -n 8 \
    --junitxml="$OUT/junit_moe.xml"
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests moe_tests
  grep -hE "^\|" "$OUT/tiles_new.txt"
  grep -m3 -hE "Error|error" "$OUT/tiles_new.txt" | cut -c1-300
  ;;
esac
pack_out
