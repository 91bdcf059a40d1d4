#!/usr/bin/env bash
# Session 16's GPU runs (docs/reports/gpu-session-2026-12-01-s16.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s16.sh   (1 x H200: session 15's prepared `PART=next`:
#       exp_gemm_masked_tiles.py --convert and exp_gemm_gluon_fp4_ws.py --convert (byte-pair and folded-scale weight
#       conversions, edited copies of gemm_gluon_kernel, bitwise against the shipped one), every mini-deepgemm GPU
#       test, and test_topk_exact.py (session 15's review change to _chunked_topk, its strided test))
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s16
PYTEST="python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning"
case "${PART:-r1}" in
r1)
  run convert 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --convert"
  run convert_ws 180 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --convert"
  run topk_tests 60 $PYTEST -n 4 packages/mini-flashmla/tests/test_topk_exact.py
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  cat "$OUT/summary.txt"; tail -6 "$OUT/convert.txt"; tail -8 "$OUT/convert_ws.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/topk_tests.txt" "$OUT/deepgemm_tests.txt" | tail -10
  ;;
esac
pack_out
