#!/usr/bin/env bash
# Session 50's GPU runs (docs/reports/gpu-session-2026-12-05-s50.md); files under $OUT, packed by pack_out.
# Run 1 was gpu_s49.sh PART=r4 on main (the suites session 49 owed).
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s50.sh   (1 x H200; tree = main + the split masked tiles
#       (gemm._masked_launches) + the folded loop's scales in shared memory; .ab-mid.tar.gz = the split alone,
#       .ab-base.tar.gz = main 20f14fa): the FP8-MMA MoE kernels' tests; exp_moe_masked_tiles (96 experts at ~16 / 32
#       / 64 rows: one launch of T or 2T tokens against the split) on the tree and on mid; exp_moe_weight_order (the
#       routed masked loads, ~1 to ~64 rows) on the tree and on base; the runtime's core GPU tests; bench_decode
#       (seven layers) on the tree and on base
#   PART=r3 (tree = main + the split alone, the staged scales reverted): the FP8-MMA MoE kernels' tests,
#       exp_moe_weight_order, the runtime's core GPU tests
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s50
case "${PART:-r2}" in
r2)
  fp4_e4m3_tests 100
  script_sides 150 exp_moe_masked_tiles.py tiles new mid
  script_sides 100 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "^\|" "$OUT/tiles_new.txt" "$OUT/tiles_mid.txt" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/tiles_new.txt" "$OUT/tiles_mid.txt" "$OUT/order_new.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r3)  # the shipped tree (the split alone; run 2's staged scales reverted): its tests and the routed masked loads
  fp4_e4m3_tests 100
  script_sides 100 exp_moe_weight_order.py order new
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "^\| masked" "$OUT/order_new.txt"
  ;;
esac
pack_out
