#!/usr/bin/env bash
# Session 43's GPU runs (docs/reports/gpu-session-2026-12-04-s43.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s43.sh   (1 x H200; tree = 32b456c: main + the UE8M0 decode
#       as one integer max + the step-tiled weight experiment's W_TILED flag, reverted by the next commit, so on main
#       the part stops at exp_moe_tiled_weights; .ab-base.tar.gz = c8248c5, session 42's last tree): the V4.1 GEMM
#       tests and the dense batch-invariance test; the FP8-MMA MoE kernels' tests (their source gained W_TILED, off
#       by default); bench_dense_decode on the tree and the base; exp_moe_tiled_weights
#   PART=r2 (tree = main + the sampler's greedy path; .ab-base.tar.gz = c8248c5): test_sampler.py; bench_logits_sampler
#       on the tree and the base; exp_hc_decode_tiles
#   PART=r3 (tree = main: the sampler's greedy loop, the hc mixes' token block by T; .ab-base.tar.gz = c8248c5):
#       test_sampler.py and test_hyper_connections.py; bench_logits_sampler --sampler-only on the tree and the base;
#       the runtime's core GPU tests; bench_decode (all seven sample layers) on the tree and the base; the rest of the
#       runtime suite
#   PART=r4 (the same tree): mini-deepgemm's and mini-flashmla's GPU suites, mini-deepep's single-GPU tests
#   PART=r5 (tree = 9a3c15d: main + the per-query indexer kernel's loads one / two tiles ahead, and an experiment knob
#       for its register cap, both reverted by the next commit (on main the capped side is the tree again);
#       .ab-base.tar.gz = c8248c5): mini-flashmla's GPU suite; bench_flashmla's indexer part on the
#       tree, the tree capped at 128 registers, and the base; bench_reindex on the tree and the base; the runtime's
#       core GPU tests; bench_decode (all seven sample layers) on the tree and the base
#   PART=r6 (tree = main: the decode step's window rows once per step, the REUSE layers' compressed rows once per
#       ratio; .ab-base.tar.gz = a4d8d80, runs 3-4's tree): the runtime's core GPU tests; bench_decode (all seven
#       sample layers) on the tree and the base
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s43
case "${PART:-r1}" in
r1)
  v41_tests 150
  fp4_e4m3_tests 120
  for side in new base; do
    run "dense_decode_$side" 90 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_dense_decode.py \
      --out "$OUT/dense_$side"
  done
  script_sides 240 exp_moe_tiled_weights.py tiled new
  cat "$OUT/summary.txt"; test_summary v41_tests fp4_e4m3_tests
  grep -E "^\|" "$OUT/dense_decode_new.txt" "$OUT/dense_decode_base.txt" "$OUT/tiled_new.txt"
  grep -m3 -E "Error|error" "$OUT/tiled_new.txt" "$OUT/dense_decode_new.txt" | cut -c1-300
  ;;
r2)
  run sampler_tests 90 $PYTEST -n 4 runtime/tests/test_sampler.py --junitxml="$OUT/junit_sampler.xml"
  for side in new base; do
    run "sampler_$side" 120 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_logits_sampler.py \
      --out "$OUT/sampler_$side.json"
  done
  script_sides 200 exp_hc_decode_tiles.py hc_tiles new
  cat "$OUT/summary.txt"; test_summary sampler_tests
  grep -hE "^\| [0-9]+ \| (greedy|half|sampled)" "$OUT/sampler_new.txt" "$OUT/sampler_base.txt"
  grep -E "^\|" "$OUT/hc_tiles_new.txt"; grep -m3 -E "Error|error" "$OUT/hc_tiles_new.txt" | cut -c1-300
  ;;
r3)
  run own_tests 90 $PYTEST -n 8 runtime/tests/test_sampler.py runtime/tests/test_hyper_connections.py \
    --junitxml="$OUT/junit_own.xml"
  for side in new base; do
    run "sampler_$side" 90 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_logits_sampler.py \
      --sampler-only --out "$OUT/sampler_$side.json"
  done
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  rest_ab 75 110
  cat "$OUT/summary.txt"; test_summary own_tests runtime_tests runtime_rest_a runtime_rest_b
  grep -hE "^\| [0-9]+ \| (greedy|half|sampled)" "$OUT/sampler_new.txt" "$OUT/sampler_base.txt"
  grep -hE "graphs=1|^(hc|other) |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r4)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  run flashmla_tests 150 $PYTEST -n 8 packages/mini-flashmla/tests --junitxml="$OUT/junit_flashmla.xml"
  run deepep_tests 90 $PYTEST -n 4 packages/mini-deepep/tests -m "not multigpu" --junitxml="$OUT/junit_deepep.xml"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests flashmla_tests deepep_tests
  ;;
r5)
  run flashmla_tests 150 $PYTEST -n 8 packages/mini-flashmla/tests --junitxml="$OUT/junit_flashmla.xml"
  for side in new capped base; do
    patch="pass"
    [ "$side" = capped ] && patch="import mini_flashmla.api as A; A.INDEXER_PER_QUERY_MAXNREG = 128"
    run "indexer_$side" 90 env PYTHONPATH="$(side_path $side)" OUT="$OUT" BENCH_PARTS=indexer \
      BENCH_JSON="indexer_$side.json" \
      bash -c "cd benchmarks && python3 -c \"$patch; import runpy; runpy.run_path('bench_flashmla.py', run_name='__main__')\""
  done
  for side in new base; do
    run "reindex_$side" 90 env PYTHONPATH="$(side_path $side)" OUT="$OUT/reindex_$side" \
      bash -c "mkdir -p \$OUT && python3 benchmarks/bench_reindex.py"
  done
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -hiE "indexer.*decode|^\| indexer" "$OUT"/indexer_*.txt | cut -c1-200
  grep -hE "new|old|candidate" "$OUT"/reindex_*.txt | cut -c1-200 | head -20
  grep -hE "graphs=1|^(indexer) |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r6)
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary runtime_tests
  grep -hE "graphs=1|^(sparse attention|other|projections) |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
esac
pack_out
