#!/usr/bin/env bash
# Session 12's GPU runs (docs/reports/gpu-session-2026-12-01-s12.md); files under $OUT.
#   source .devdeps/env.sh && PART=attn bash benchmarks/gpu_s12.sh   (1 x H200: mini-flashmla's GPU tests, the model
#       vs reference GPU tests incl. the 64-head model (Gluon attention inside a model), then the Gluon attention
#       breakdown with session 11's row_sum_once candidate)
#   source .devdeps/env.sh && PART=v41 bash benchmarks/gpu_s12.sh    (1 x H200: the V4.1-recipe FP8 Gluon GEMM's tests,
#       then its experiment against the shipped bf16-MMA route and cuBLAS)
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
v41)
  timeout 300 python3 -m pytest -q -rs -x -p no:cacheprovider packages/mini-deepgemm/tests/test_gemm_gluon_v41.py \
    > "$OUT/pytest_v41.txt" 2>&1
  echo "v41 tests rc=$?"; tail -25 "$OUT/pytest_v41.txt"
  (cd benchmarks && timeout 240 python3 exp_gemm_gluon_v41.py > "$OUT/exp_v41.txt" 2>&1; echo "v41 exp rc=$?")
  tail -40 "$OUT/exp_v41.txt"
  timeout 150 python3 -m pytest -q -rs -s -p no:cacheprovider integration_tests/test_model_vs_reference.py -m gpu \
    -k 64_heads > "$OUT/model_64_heads.txt" 2>&1  # the Gluon attention case and its Triton control
  echo "64-head model rc=$?"; grep -E "cosine|greedy|passed|failed|Error" "$OUT/model_64_heads.txt" | tail -8
  ;;
esac
