#!/usr/bin/env bash
# Session 12's GPU runs (docs/reports/gpu-session-2026-12-01-s12.md); files under $OUT.
#   source .devdeps/env.sh && PART=attn bash benchmarks/gpu_s12.sh   (1 x H200: mini-flashmla's GPU tests, the model
#       vs reference GPU tests incl. the 64-head model (Gluon attention inside a model), then the Gluon attention
#       breakdown with session 11's row_sum_once candidate)
set -u
export OUT=${OUT:-/tmp/gpu_s12}
mkdir -p "$OUT"
case "${PART:-attn}" in
attn)
  timeout 200 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-flashmla/tests -m gpu > "$OUT/flashmla_tests.txt" 2>&1
  echo "flashmla gpu tests rc=$?"; tail -3 "$OUT/flashmla_tests.txt"
  timeout 200 python3 -m pytest -q -rs -s -p no:cacheprovider integration_tests/test_model_vs_reference.py -m gpu \
    > "$OUT/model_vs_reference.txt" 2>&1
  echo "model vs reference rc=$?"; grep -E "cosine|greedy|passed|failed|Error" "$OUT/model_vs_reference.txt" | tail -8
  (cd benchmarks && timeout 150 python3 exp_flashmla_gluon_breakdown.py > "$OUT/breakdown.txt" 2>&1; echo "breakdown rc=$?")
  tail -16 "$OUT/breakdown.txt"
  ;;
esac
