#!/usr/bin/env bash
# Session 33's GPU runs (docs/reports/gpu-session-2026-12-03-s33.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s33.sh   (1 x H200, tree = main db6985c; .ab-base.tar.gz =
#       4058c1f: session 32's review mend (74ed474, the compressed KV and index keys packed before their FP4 round
#       trips) on the GPU for the first time: the runtime's core GPU tests and the rest of its GPU suite (with
#       test_reference_model.py's new packing test); bench_prefill on the tree and on 4058c1f)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s33.sh   (1 x H200, tree = the FP4 decode by byte-permute
#       tables (mini-flashmla: Gluon attention producer, per-query indexer, Triton attention); .ab-base.tar.gz = a6bff55
#       (before it): the mini-flashmla GPU suite, the runtime's core GPU tests; bench_flashmla (every part, with the new
#       per-query indexer rows), bench_prefill and bench_decode on new and base)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s33.sh   (1 x H200, tree = run 2's tables with the Triton
#       kernels back on the even / odd byte form (run 2's dim-order words sent the per-query indexer's keys through
#       shared memory: 0.86x) and the table words made per element; .ab-base.tar.gz = a6bff55: as r2, plus
#       exp_indexer_tiles.py --per-query (the per-query launch re-swept on the new decode))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s33.sh   (1 x H200, tree = the table decode reverted;
#       .ab-alt.tar.gz = 8e191b3 (run 3's table decode): exp_alu_rates.py (issue rates of PRMT against the instructions
#       it replaced), Nsight Compute of the per-query indexer (batch 64) on both trees)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s33.sh   (1 x H200: exp_alu_rates.py with the alternating
#       pairs, which tell which instructions share an issue pipe)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s33
case "${PART:-r1}" in
r2|r3)
  [ "$PART" = r3 ] && run exp_per_query 100 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  ;;&
r1)
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run runtime_rest 150 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  run prefill_new 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  prefill_sides 45 base
  cat "$OUT/summary.txt"; test_summary runtime_tests runtime_rest
  show_sides new base
  grep -E "^(compressor|indexer|window cache|other) " "$OUT"/prefill_{new,base}.txt
  ;;
r2|r3)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new base; do
    run "flashmla_$side" 120 env PYTHONPATH="$(side_path $side)" BENCH_JSON="flashmla_$side.json" \
      bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  prefill_sides 45 new base
  for side in new base; do decode_bench "decode_$side" env PYTHONPATH="$(side_path $side)"; done
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new base
  grep -hE "^\| indexer" "$OUT"/flashmla_{new,base}.txt | cut -c1-200
  grep -E "^(indexer|sparse attention) " "$OUT"/prefill_{new,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  [ -f "$OUT/exp_per_query.txt" ] && grep -hE "^\|" "$OUT/exp_per_query.txt" | head -24 | cut -c1-200
  ;;
r5)
  run exp_alu 100 bash -c "cd benchmarks && python3 exp_alu_rates.py"
  cat "$OUT/summary.txt"; grep -hE "^\|" "$OUT/exp_alu.txt"
  ;;
r4)
  run exp_alu 100 bash -c "cd benchmarks && python3 exp_alu_rates.py"
  ncu_profile indexer_decode
  PYTHONPATH="$(side_path alt)" NCU_TAG=_tables ncu_profile indexer_decode
  cat "$OUT/summary.txt"; grep -hE "^\|" "$OUT/exp_alu.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" indexer_decode indexer_decode_tables 2>&1 | head -60 | cut -c1-200
  ;;
esac
pack_out
