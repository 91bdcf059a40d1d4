#!/usr/bin/env bash
# Session 39's GPU runs (docs/reports/gpu-session-2026-12-04-s39.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s39.sh   (1 x H200, tree = main: the mini-deepgemm GPU
#       suite and bench_fp4_e4m3_route after session 38's unrun mends (731a227, 98f7830, bc40823))
#   PART=r2 (.ab-base.tar.gz = 0db79cb's src folders, carried): the 256-row tiles cut at each expert (tile table):
#       the mini-deepgemm GPU suite, exp_moe_tile_table on new and base, the runtime's core GPU tests, bench_prefill
#       on new and base
#   PART=r3 (.ab-base.tar.gz as r2): the 128-row tiles' own idle loop back (r2's merged loop cost them 1-3%), the
#       route's threshold at 256 rows per expert: the same, exp_moe_tile_table with a layout of ~255 rows per expert,
#       bench_fp4_e4m3_route on new
#   PART=r4 (.ab-base.tar.gz as r2): exp_moe_tile_table on new (with EP2's layout), Nsight Compute on the contiguous
#       route at 96 experts of 128-1,024 rows, w13 (moe_w13_fold128), on new and base
#   PART=r5 (.ab-base.tar.gz as r2): the final tree (128-row path's SASS back to base's, threshold 192): the
#       mini-deepgemm GPU suite, exp_moe_tile_table on new and base, bench_fp4_e4m3_route, the runtime's core GPU tests
#   PART=r6: the final tree (128-row tiles pass used_0 = True: their SASS 0db79cb's): the mini-deepgemm GPU suite,
#       bench_fp4_e4m3_route
# (the tile_table parts written with gpu_session.sh's script_sides after the runs: the same commands; the experiment
# itself is in commit 2e3c1a0)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s39
case "${PART:-r1}" in
r1|r6)
  run deepgemm_tests 170 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  route_sides 90 new
  cat "$OUT/summary.txt"; test_summary deepgemm_tests
  grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' "$OUT/route_new.txt" \
    | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  ;;
r2|r3)
  run deepgemm_tests 140 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  script_sides 110 exp_moe_tile_table.py tile_table new base
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 70 new
  prefill_sides 45 base
  [ "$PART" = r3 ] && route_sides 80 new
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for side in new base; do echo "== $side"; grep -E "^\|" "$OUT/tile_table_$side.txt"; done
  grep -m3 -E "Error|error" "$OUT/tile_table_new.txt" | cut -c1-300
  show_sides new base
  [ "$PART" = r3 ] && grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' \
    "$OUT/route_new.txt" | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  ;;
r4)
  script_sides 110 exp_moe_tile_table.py tile_table new
  NCU_SECS=100 ncu_profile moe_w13_fold128
  (export PYTHONPATH=$BASE_PYTHONPATH; NCU_SECS=100 NCU_TAG=_base ncu_profile moe_w13_fold128)
  cat "$OUT/summary.txt"; grep -E "^\|" "$OUT/tile_table_new.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -60
  ;;
r5)
  run deepgemm_tests 140 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  script_sides 110 exp_moe_tile_table.py tile_table new base
  route_sides 80 new
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for side in new base; do echo "== $side"; grep -E "^\|" "$OUT/tile_table_$side.txt"; done
  grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' "$OUT/route_new.txt" \
    | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  ;;
esac
pack_out
