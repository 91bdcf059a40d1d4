#!/usr/bin/env bash
# Session 44's GPU runs (docs/reports/gpu-session-2026-12-04-s44.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s44.sh   (1 x H200; tree = main + _masked_tile's register
#       cap): the FP8-MMA MoE kernels' tests; exp_moe_masked_tiles (8- and 16-token tiles, register caps 128 / 96 /
#       80, at 384 experts of ~1 / 2 / 4 rows and 96 of ~8)
#   PART=r2 (tree = main: the 8-token tile routed up to ~4 rows, one program per expert looping over its token tiles;
#       .ab-base.tar.gz = a60d3ca, session 43's last tree): the FP8-MMA MoE kernels' tests; exp_moe_masked_tiles
#       (one program per tile against one per expert, at the engine's capacities); the runtime's core GPU tests;
#       bench_decode (all seven sample layers) on the tree and on the base (a third side, the tree with one program
#       per tile, failed at its import: bench_prefill off the path)
#   PART=r3 (tree = main: one program per expert also for 16-token tiles up to ~8 rows; the same base): the FP8-MMA
#       MoE kernels' tests; the runtime's core GPU tests; bench_decode at batch 128 / 256 (~2 / ~4 rows per expert),
#       32,768 tokens of context, on the tree and the base
#   PART=r4 (tree = main: the masked layout up to 256 tokens, CUDA graphs of 96-256 rows; the same base): the runtime's
#       core GPU tests; bench_decode at batch 128 / 256, 32,768 tokens, on the tree, on the tree with the masked
#       layout capped at 64 tokens again ("contiguous"), and on the base
#   PART=r5 (tree = main, the session's final source): mini-deepgemm's GPU suite, mini-deepep's single-GPU tests;
#       tree_checks: test_cuda_decode.py (graphs past 64 rows), the runtime's core GPU tests, bench_decode (seven
#       sample layers, batch 32 / 64, 131,072 tokens), the rest of the runtime suite
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s44
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 120
  script_sides 240 exp_moe_masked_tiles.py tiles new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests
  grep -E "^\|" "$OUT/tiles_new.txt"; grep -m3 -E "Error|error" "$OUT/tiles_new.txt" | cut -c1-300
  ;;
r2)
  fp4_e4m3_tests 120
  script_sides 150 exp_moe_masked_tiles.py tiles new
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new
  decode_all_sides base
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -E "^\|" "$OUT/tiles_new.txt"; grep -m3 -E "Error|error" "$OUT/tiles_new.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r3)
  fp4_e4m3_tests 120
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new base; do
    run "decode_wide_$side" 200 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py \
      --preset medium --layers "$ALL_LAYERS" --batches 128,256 --contexts 32768 --kv-cache-gb 24 --profile \
      --out "$OUT/decode_wide_${side}_h200.json"
  done
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_wide_new.txt" "$OUT/decode_wide_base.txt"
  ;;
r4)
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  wide="--preset medium --layers $ALL_LAYERS --batches 128,256 --contexts 32768 --kv-cache-gb 24"
  run decode_wide_new 200 python3 benchmarks/bench_decode.py $wide --profile --out "$OUT/decode_wide_new_h200.json"
  contiguous="import runpy, sys; sys.path.insert(0, 'benchmarks'); import mini_deepinfer.models.deepseek_v41.moe as M
M.MASKED_MAX_TOKENS = 64
sys.argv = ['bench_decode.py'] + '$wide'.split() + ['--out', '$OUT/decode_wide_contiguous_h200.json']
runpy.run_path('benchmarks/bench_decode.py', run_name='__main__')"
  run decode_wide_contiguous 200 python3 -c "$contiguous"
  run decode_wide_base 200 env PYTHONPATH="$(side_path base)" python3 benchmarks/bench_decode.py $wide \
    --out "$OUT/decode_wide_base_h200.json"
  cat "$OUT/summary.txt"; test_summary runtime_tests
  grep -hE "graphs=1|^moe experts |^stage" "$OUT"/decode_wide_{new,contiguous,base}.txt
  grep -m3 -hE "Error|error" "$OUT"/decode_wide_{new,contiguous,base}.txt | cut -c1-300
  ;;
r5)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  run deepep_tests 60 $PYTEST -n 4 packages/mini-deepep/tests -m "not multigpu" --junitxml="$OUT/junit_deepep.xml"
  tree_checks cuda_decode_tests 110 "moe experts" runtime/tests/test_cuda_decode.py
  test_summary deepgemm_tests deepep_tests
  ;;
esac
pack_out
