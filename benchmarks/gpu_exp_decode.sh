#!/usr/bin/env bash
# Session 5's GPU experiment (docs/reports/deepgemm-masked-swapab.md): the masked (decode) and few-row dense GEMMs
# on the swap-AB kernel with the activations dequantized per tile. Its GPU tests (incl. the batch-invariance test
# that was a strict xfail for FP4), the runtime's MoE and CUDA decode tests, then the decode GEMM experiment.
#   source .devdeps/env.sh && bash benchmarks/gpu_exp_decode.sh
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_exp_decode
run tests 240 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-deepgemm/tests/test_gemm_swapab.py \
  packages/mini-deepgemm/tests/test_gemm.py runtime/tests/test_moe_grouped.py runtime/tests/test_cuda_decode.py
run decode 300 python3 benchmarks/exp_gemm_swapab.py --decode --out "$OUT/exp"
run words 200 python3 benchmarks/exp_gemm_swapab.py --scale-words --out "$OUT/words"
cat "$OUT/env.txt" "$OUT/summary.txt"
grep -E "FAILED|ERROR|passed|failed|XPASS" "$OUT/tests.txt" | tail -20
grep -c error "$OUT/exp/results.json" "$OUT/words/results.json"
