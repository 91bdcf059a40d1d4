#!/usr/bin/env bash
# Session 14's GPU runs (docs/reports/gpu-session-2026-12-01-s14.md); files under $OUT, packed by pack_out.
# Run 1 was session 13's prepared `PART=next bash benchmarks/gpu_s13.sh`.
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s14.sh   (1 x H200: the indexer's per-query path swept
#       (decode, batch 64 / 256), the attention kernel with QK^T duplicated per consumer warpgroup, then
#       mini-flashmla's GPU tests on the tree after session 13's review refactors)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s14.sh   (ran at e8911ae; 1 x H200: exp_gemm_gluon_split.py (the dense V3 and
#       V4.1 GEMMs with one consumer partition per math warpgroup; V3 also at 128 x 256 tiles), then the V4.1 GEMM's
#       tests (its math partition now takes a first row, PTX unchanged offline))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s14.sh   (1 x H200: the V3 and V4.1 kernels with one partition
#       per math warpgroup in the package (V3 at 128 x 256 where the waves fill): every mini-deepgemm GPU test and the
#       bench_deepgemm table; the indexer's new per-query kernel: exp_indexer_tiles.py --per-query against the old
#       launch, then mini-flashmla's GPU tests)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s14.sh   (1 x H200: the 1-GPU prefill step, bench_flashmla's
#       indexer (the shared path's kernel after the helper split) and decode, the indexer tests with the per-query
#       launch at 1 stage (run 4's best), and the runtime tests that run the indexer's decode path and the dense GEMMs)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s14.sh   (1 x H200: exp_gemm_gluon_v3_variants.py (A in
#       registers, 16 row tiles per L2 sweep), then the runtime and integration tests that run 5 did not run, and the
#       offline example)
#   source .devdeps/env.sh && PART=next bash benchmarks/gpu_s14.sh  (for the next session, 1 x H200, ~8 minutes, never
#       run: test_gemm_gluon.py with the 4-consumer variant of the warp-specialized FP4 MoE GEMM, then
#       exp_gemm_gluon_fp4_ws.py --consumers (2 vs 4 consumer warpgroups, bitwise), then the decode step of the
#       medium model at 32k and 131k context with a profile (where the per-query indexer kernel matters; the
#       committed decode figures are at 1,024))
#   source .devdeps/env.sh && PART=next2 bash benchmarks/gpu_s14.sh (for the next session, 1 x H200, ~5 minutes, never
#       run: exp_indexer_query_stationary.py (the prefill indexer with queries held and keys streamed), the per-query
#       kernel again with its grid's axes swapped after run 4 (queries on x), then mini-flashmla's GPU tests)
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
r3)
  run split 330 bash -c "cd benchmarks && python3 exp_gemm_gluon_split.py"
  run v41_tests 150 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py
  cat "$OUT/summary.txt"; tail -22 "$OUT/split.txt"; tail -3 "$OUT/v41_tests.txt"
  ;;
r4)
  run deepgemm_tests 130 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-deepgemm/tests -m gpu
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  run indexer_per_query 130 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  run flashmla_tests 120 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-flashmla/tests -m gpu
  cat "$OUT/summary.txt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/deepgemm_tests.txt" | tail -12
  tail -30 "$OUT/deepgemm.txt"; tail -20 "$OUT/indexer_per_query.txt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/flashmla_tests.txt" | tail -8
  ;;
r5)
  run prefill 110 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run flashmla 70 bash -c "cd benchmarks && BENCH_PARTS=indexer,decode python3 bench_flashmla.py"
  run indexer_tests 60 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-flashmla/tests/test_kernels.py -k indexer
  run runtime_tests 240 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning \
    runtime/tests/test_cuda_decode.py runtime/tests/test_decode_path.py integration_tests/test_model_vs_reference.py \
    integration_tests/test_engine_vs_reference.py -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; tail -28 "$OUT/prefill.txt"; tail -10 "$OUT/flashmla.txt"; tail -2 "$OUT/indexer_tests.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_tests.txt" | tail -15
  ;;
r6)
  run v3_variants 130 bash -c "cd benchmarks && python3 exp_gemm_gluon_v3_variants.py"
  run runtime_rest 360 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning \
    runtime/tests integration_tests -m "not multigpu" -n 16 --ignore=runtime/tests/test_cuda_decode.py \
    --ignore=runtime/tests/test_decode_path.py --ignore=integration_tests/test_model_vs_reference.py \
    --ignore=integration_tests/test_engine_vs_reference.py --junitxml="$OUT/junit_runtime_rest.xml"
  run offline 40 python3 runtime/examples/offline_inference.py
  cat "$OUT/summary.txt"; tail -12 "$OUT/v3_variants.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_rest.txt" | tail -15
  tail -3 "$OUT/offline.txt"
  ;;
next)
  run gemm_gluon 120 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run consumers 180 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --consumers"
  run decode_long 200 python3 benchmarks/bench_decode.py --preset medium --batches 8,32 --contexts 32768,131072 \
    --profile --out "$OUT/decode_medium_long_h200.json"
  cat "$OUT/summary.txt"; tail -3 "$OUT/gemm_gluon.txt"; tail -9 "$OUT/consumers.txt"; tail -30 "$OUT/decode_long.txt"
  ;;
next2)
  run query_stationary 200 bash -c "cd benchmarks && python3 exp_indexer_query_stationary.py"
  run indexer_per_query 100 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  run flashmla_tests 150 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-flashmla/tests -m gpu
  cat "$OUT/summary.txt"; tail -24 "$OUT/query_stationary.txt"; tail -20 "$OUT/indexer_per_query.txt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/flashmla_tests.txt" | tail -8
  ;;
esac
pack_out
