#!/usr/bin/env bash
# Session 45's GPU runs (docs/reports/gpu-session-2026-12-04-s45.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s45.sh   (1 x H200; tree = main: the FP8-MMA MoE route's
#       weights in the kernels' order; .ab-base.tar.gz = dd4381f, session 44's last tree): mini-deepgemm's GPU suite;
#       session 44's unrun edits (test_linear_fp32.py, test_moe_route.py); exp_moe_weight_order on both sides; the
#       runtime's core GPU tests; bench_decode (seven sample layers, batch 32 / 64, 131,072 tokens) on both sides
#       (the tree's side ran out of memory: KernelWeights reordered into new tensors while the caller held the old)
#   PART=r2 (tree = main: the order's words 4c + q, reordered in place; the same base): mini-deepgemm's GPU suite;
#       exp_moe_weight_order, the runtime's core GPU tests, bench_decode and bench_prefill, each on both sides
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s45
case "${PART:-r1}" in
r1)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  run s44_edits 90 $PYTEST -n 8 runtime/tests/test_linear_fp32.py runtime/tests/test_moe_route.py \
    --junitxml="$OUT/junit_s44_edits.xml"
  script_sides 120 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests s44_edits runtime_tests
  grep -hE "^\|" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/order_new.txt" "$OUT/order_base.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r2)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  script_sides 120 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  prefill_sides 100 new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  grep -hE "^\|" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/order_new.txt" "$OUT/order_base.txt" "$OUT/decode_new.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  grep -hE "tok/s|moe experts" "$OUT/prefill_new.txt" "$OUT/prefill_base.txt" | cut -c1-200
  ;;
esac
pack_out
