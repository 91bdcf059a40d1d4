#!/usr/bin/env bash
# Session 53's GPU runs (docs/reports/gpu-session-2026-12-05-s53.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s53.sh   (1 x H200; tree = main + ring slots of two
#       unrolled K steps routed to the folded masked loop's tiles of at most 16 tokens that are not split, and a
#       split's wide launch on a side stream as an experiment (off); .ab-base.tar.gz = main 86d4e0a, one step per
#       slot): the FP8-MMA MoE kernels' tests (with the side stream's bitwise test); the runtime's core GPU tests (the
#       engine's decode runs the new route); bench_decode (seven layers, batch 32 / 64: ~0.75 / ~1.5 rows per
#       expert, the 8-token tile) on the tree and on base; exp_moe_masked_tiles (one step, two unrolled, two looped,
#       two on the one-program launches only, the route with a split's wide launch on a side stream)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s53
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 100
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 100 && script_sides 100 exp_moe_masked_tiles.py tiles new
  fits 200 && decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  grep -hE "^\||^split" "$OUT/tiles_new.txt"
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r2)  # the decode A/B on an H100 (run 1's seven layers at 24 GB of KV cache ran out of its 80 GB): bench_decode's
  # default layers, 8 GB of cache, batch 32 / 64 at 131,072 tokens, on the tree and on base
  decode_bench decode_new env PYTHONPATH="$(side_path new)"
  decode_bench decode_base env PYTHONPATH="$(side_path base)"
  cat "$OUT/summary.txt"; grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r3)  # the side stream on by default: the kernels' tests, the runtime's core GPU tests, the tiles again (a repeat)
  fp4_e4m3_tests 60
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 90 && script_sides 90 exp_moe_masked_tiles.py tiles new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests; grep -hE "^\||^split" "$OUT/tiles_new.txt"
  ;;
esac
pack_out
