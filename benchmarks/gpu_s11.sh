#!/usr/bin/env bash
# Session 11's GPU runs (docs/reports/gpu-session-2026-12-01-s11.md); files under $OUT.
#   (run 1 ran PART=gemm of commit d723f7d: the warp-specialized V3 GEMM experiment and bench_deepgemm --graph)
#   source .devdeps/env.sh && PART=gemm2 bash benchmarks/gpu_s11.sh  (1 x H200: mini-deepgemm's GPU tests with the
#       warp-specialized kernel routed, the V3 GEMM experiment (shipped kernel, Triton, cuBLAS), then bench_deepgemm's
#       full table in GPU time with the copy peer by do_bench; --m covers only the dense rows, which changed too)
#   source .devdeps/env.sh && PART=attn bash benchmarks/gpu_s11.sh   (1 x H200: mini-flashmla's GPU tests, the model
#       vs reference tests incl. 64 heads, bench_flashmla, then the Gluon attention breakdown with the row_sum_once
#       candidate; written after the last run of session 11, not run)
set -u
export OUT=${OUT:-/tmp/gpu_s11}  # the experiments write $OUT/*.json
mkdir -p "$OUT"
case "${PART:-gemm2}" in
gemm2)
  timeout 300 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepgemm/tests -m gpu > "$OUT/pytest_deepgemm_gpu.txt" 2>&1
  echo "deepgemm gpu tests rc=$?"
  tail -15 "$OUT/pytest_deepgemm_gpu.txt"
  (cd benchmarks && timeout 150 python3 exp_gemm_gluon_v3.py > "$OUT/exp_gemm_gluon_v3.txt" 2>&1; echo "v3 exp rc=$?")
  tail -12 "$OUT/exp_gemm_gluon_v3.txt"
  (cd benchmarks && timeout 330 python3 bench_deepgemm.py --graph --out "$OUT" > "$OUT/bench_deepgemm.txt" 2>&1; echo "bench rc=$?")
  tail -45 "$OUT/bench_deepgemm.txt"
  ;;
attn)
  timeout 200 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-flashmla/tests -m gpu > "$OUT/flashmla_tests.txt" 2>&1
  echo "flashmla gpu tests rc=$?"; tail -3 "$OUT/flashmla_tests.txt"
  timeout 200 python3 -m pytest -q -rs -s -p no:cacheprovider integration_tests/test_model_vs_reference.py -m gpu \
    > "$OUT/model_vs_reference.txt" 2>&1  # incl. the 64-head model (the Gluon attention in a model)
  echo "model vs reference rc=$?"; grep -E "cosine|greedy|passed|failed" "$OUT/model_vs_reference.txt" | tail -6
  (cd benchmarks && timeout 120 python3 bench_flashmla.py > "$OUT/bench_flashmla.txt" 2>&1; echo "bench rc=$?")
  tail -14 "$OUT/bench_flashmla.txt"
  (cd benchmarks && timeout 150 python3 exp_flashmla_gluon_breakdown.py > "$OUT/breakdown.txt" 2>&1; echo "breakdown rc=$?")
  tail -16 "$OUT/breakdown.txt"
  ;;
esac
