#!/usr/bin/env bash
# Session 41's GPU runs (docs/reports/gpu-session-2026-12-04-s41.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s41.sh   (1 x H200, tree = main + bench_decode's stage
#       breakdown + masked_operands' fixed row counts): bench_decode on the medium widths with all seven sample
#       layers (a 40-layer breakdown of the decode step), batch 32 / 64 at 131,072 tokens, with --profile; the masked
#       MoE figures of bench_fp4_e4m3_route and exp_moe_masked_tiles, now on the same row counts (the decode ran out
#       of memory: the real Engram table, ~98 GB)
#   PART=r2 (the medium preset's Engram vocabulary reduced as bench_prefill's): bench_decode as in r1
#   PART=r3 (.ab-base.tar.gz = 6576820's src folders, carried): the masked MoE plan in four kernels: the MoE kernel
#       tests and the runtime's core GPU tests; bench_decode (all seven sample layers, batch 32 / 64) on new and base
#   PART=r4 (tree = main): the rest of the runtime's GPU suite (parts A and B) on the masked plan's tree;
#       exp_hc_mix_slices (the hyper-connection mixes' K slice at decode and prefill sizes; removed after the run:
#       git show 4370ea6:benchmarks/exp_hc_mix_slices.py)
#   PART=r5 (.ab-base.tar.gz = 4370ea6's src folders, carried): the mixes' K slice 2,048 -> 1,024: the hyper-connection
#       tests and the runtime's core GPU tests; bench_decode (as r3) and bench_prefill on new and base
#   PART=r6 (tree = main, final): the rest of the runtime's GPU suite (parts A and B) with the slice of 1,024
#   PART=r7 (tree = main + the decode indexer's key rows in one kernel): its tests and the runtime's core GPU tests;
#       bench_decode (as r3) on the tree alone (the device time left allowed no base side: r5's new side is the
#       cross-run reference); the rest of the runtime's GPU suite, last
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s41
case "${PART:-r1}" in
r1|r2)
  run decode_all 300 python3 benchmarks/bench_decode.py --preset medium --layers "$ALL_LAYERS" --batches 32,64 \
    --contexts 131072 --kv-cache-gb 24 --profile --out "$OUT/decode_all_h200.json"
  if [ "$PART" = r1 ]; then
    route_sides 120 new
    script_sides 150 exp_moe_masked_tiles.py masked_tiles new
  fi
  cat "$OUT/summary.txt"
  grep -E "ms/step|^stage|^[a-z].* [0-9.]+ +[0-9.na]+$|Error|error" "$OUT/decode_all.txt" | cut -c1-200 | tail -40
  [ "$PART" = r1 ] && grep -E "^\| masked" "$OUT/route_new.txt" && grep -E "^\|" "$OUT/masked_tiles_new.txt"
  ;;
r3)
  run moe_kernel_tests 120 $PYTEST -n 8 runtime/tests/test_moe_kernels.py --junitxml="$OUT/junit_moe_kernels.xml"
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary moe_kernel_tests runtime_tests
  grep -hE "graphs=1|^moe dispatch|^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r4)
  script_sides 150 exp_hc_mix_slices.py hc_slices new
  rest_ab 110 200
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  grep -E "^\|" "$OUT/hc_slices_new.txt"; grep -m3 -E "Error|error" "$OUT/hc_slices_new.txt" | cut -c1-300
  ;;
r5)
  run hc_tests 90 $PYTEST -n 8 runtime/tests/test_hyper_connections.py --junitxml="$OUT/junit_hc.xml"
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  prefill_sides 150 new base
  cat "$OUT/summary.txt"; test_summary hc_tests runtime_tests
  grep -hE "graphs=1|^hc |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"; show_sides new base
  ;;
r6)
  rest_ab 110 200
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  ;;
r7)
  tree_checks entry_rows_tests 110 indexer runtime/tests/test_entry_rows.py
  ;;
esac
pack_out
