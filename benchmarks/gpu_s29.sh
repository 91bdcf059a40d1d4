#!/usr/bin/env bash
# Session 29's GPU runs (docs/reports/gpu-session-2026-12-03-s29.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s29.sh   (1 x H200, tree = main with the REINDEX layers
#       scoring only their candidate blocks; .ab-base.tar.gz = b426822: the mini-flashmla GPU suite; bench_reindex.py;
#       the runtime's core GPU tests; bench_prefill on both sides; bench_topk.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s29
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run reindex 120 bash -c "cd benchmarks && python3 bench_reindex.py"
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 60 new base
  run topk 120 bash -c "cd benchmarks && python3 bench_topk.py --out $OUT/bench_topk.json"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  tail -7 "$OUT/reindex.txt" | cut -c1-220
  show_sides new base
  grep -E "^(indexer|top-k|sparse attention|moe experts) " "$OUT/prefill_new.txt" "$OUT/prefill_base.txt"
  grep -E "blocks|top-512" "$OUT/topk.txt" | head -4 | cut -c1-200
  ;;
esac
pack_out
