#!/usr/bin/env bash
# Session 40's GPU runs (docs/reports/gpu-session-2026-12-04-s40.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s40.sh   (1 x H200, tree = main + the bf16-rows L2
#       prefetch): the mini-deepgemm GPU suite and the runtime's core GPU tests on session 39's unrun route commit
#       (4ad2fb6), the mini-flashmla GPU suite, exp_flashmla_l2_prefetch
#   PART=r2 (tree = main + the prefetch's ids loaded an iteration ahead + the tile-table test's helper restored): the
#       mini-deepgemm GPU suite, exp_flashmla_l2_prefetch, the mini-flashmla GPU suite, exp_moe_masked_tiles (token
#       tile x ring depth on the register-A masked kernel)
#   PART=r3 (tree = main, the prefetch reverted): bench_flashmla's prefill with its new gather peer (the same rows
#       read and summed, no attention) and the L2-resident pool
#   PART=r4 (tree = main, final packages): the rest of the runtime's GPU suite (parts A and B; last run in session 37,
#       before session 39's expected_m in the MoE plan) and bench_prefill
#   PART=r5 (.ab-base.tar.gz = 7a5d2f2's src folders, carried): warpgroup 1 adopts block A before its QK^T of block B
#       (tile 1, released last in a pair, gets that long to fill): the mini-flashmla GPU suite, bench_flashmla on new
#       and base
#   PART=r6 (.ab-base.tar.gz as r5): bench_prefill on new and base; attn_output_hash.py on both (the same bits)
#   (run 7: the runtime's core GPU tests on r6's tree, one command: see the session log)
#   PART=r8 (.ab-base.tar.gz as r5): Nsight Compute on the sparse prefill, paged and bf16 rows, new and base
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s40
case "${PART:-r1}" in
r1)
  script_sides 150 exp_flashmla_l2_prefetch.py l2_prefetch new
  run flashmla_tests 130 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu --junitxml="$OUT/junit_flashmla.xml"
  run deepgemm_tests 140 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests deepgemm_tests runtime_tests
  grep -E "^\|" "$OUT/l2_prefetch_new.txt"; grep -m3 -E "Error|error" "$OUT/l2_prefetch_new.txt" | cut -c1-300
  ;;
r2)
  run deepgemm_tests 140 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  script_sides 100 exp_flashmla_l2_prefetch.py l2_prefetch new
  run flashmla_tests 130 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu --junitxml="$OUT/junit_flashmla.xml"
  script_sides 200 exp_moe_masked_tiles.py masked_tiles new
  cat "$OUT/summary.txt"; test_summary deepgemm_tests flashmla_tests
  grep -E "^\|" "$OUT/l2_prefetch_new.txt" "$OUT/masked_tiles_new.txt"
  grep -m3 -E "Error|error" "$OUT/l2_prefetch_new.txt" "$OUT/masked_tiles_new.txt" | cut -c1-300
  ;;
r3)
  run flashmla_new 150 env BENCH_PARTS=prefill BENCH_JSON=flashmla_new.json \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  cat "$OUT/summary.txt"; grep -E "^\|" "$OUT/flashmla_new.txt"; grep -m3 -E "Error|error" "$OUT/flashmla_new.txt"
  ;;
r4)
  rest_ab 100 150
  prefill_sides 80 new
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b; show_sides new
  ;;
r5)
  run flashmla_tests 130 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu --junitxml="$OUT/junit_flashmla.xml"
  flashmla_sides 110 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests; show_sides new base
  ;;
r6)
  for side in new base; do
    run "hash_$side" 60 env PYTHONPATH="$(side_path $side)" python3 benchmarks/attn_output_hash.py
  done
  prefill_sides 80 new
  prefill_sides 60 base
  cat "$OUT/summary.txt"; cat "$OUT/hash_new.txt" "$OUT/hash_base.txt" | tail -4; show_sides new base
  ;;
r8)
  NCU_SECS=90 ncu_profile sparse_prefill sparse_prefill_bf16
  (export PYTHONPATH=$BASE_PYTHONPATH; NCU_SECS=90 NCU_TAG=_base ncu_profile sparse_prefill sparse_prefill_bf16)
  cat "$OUT/summary.txt"; python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -60
  ;;
esac
pack_out
