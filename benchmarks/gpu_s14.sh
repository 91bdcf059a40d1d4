#!/usr/bin/env bash
# Session 14's GPU runs (docs/reports/gpu-session-2026-12-01-s14.md); files under $OUT, packed by pack_out.
# Run 1 was session 13's prepared `PART=next bash benchmarks/gpu_s13.sh`.
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s14.sh   (1 x H200: the indexer's per-query path swept
#       (decode, batch 64 / 256), the attention kernel with QK^T duplicated per consumer warpgroup, then
#       mini-flashmla's GPU tests on the tree after session 13's review refactors)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s14
case "${PART:-r2}" in
r2)
  run indexer_per_query 120 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  run attn_dup_qk 200 bash -c "cd benchmarks && python3 exp_flashmla_gluon_dup_qk.py"
  run flashmla_tests 150 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-flashmla/tests -m gpu
  cat "$OUT/summary.txt"; tail -14 "$OUT/indexer_per_query.txt"; tail -16 "$OUT/attn_dup_qk.txt"
  tail -4 "$OUT/flashmla_tests.txt"
  ;;
esac
pack_out
