#!/usr/bin/env bash
# Session 13's GPU runs (docs/reports/gpu-session-2026-12-01-s13.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=ws bash benchmarks/gpu_s13.sh   (1 x H200: the warp-specialized FP4 MoE GEMM
#       experiment that run 1 could not start (the shipped launcher's config lookup), the Gluon FP4 GEMM tests after
#       that fix, and bench_flashmla's decode rows to check run 4's batch-256 outlier)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s13.sh   (1 x H200: the warp-specialized FP4 kernel moved
#       into the package and routed (its experiment against the one-warpgroup kernel, then every mini-deepgemm GPU
#       test), bench_flashmla's decode by graph replay with the Gluon kernel forced at every batch, the indexer's
#       launch-tile sweep, then bench_deepgemm's table)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s13.sh   (1 x H200: after run 3, the Gluon attention routed
#       for every unsplit 64-head call (decode below one program per SM) and the indexer's 64-key tiles: the Gluon FP4
#       GEMM tests (fixed N=384 case), mini-flashmla's GPU tests, bench_flashmla, the 1-GPU prefill step and the
#       medium-model decode)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s13.sh   (1 x H200: the warp-specialized FP4 kernel at the
#       1-GPU prefill's 32-96 rows per expert, 64- and 128-token tiles, against the swap-AB kernel routed there)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s13.sh   (1 x H200: the warp-specialized kernel routed above
#       48 rows per expert: its tests (a 33-96-row case added), then the 1-GPU prefill step)
#   source .devdeps/env.sh && PART=rest bash benchmarks/gpu_s13.sh   (1 x H200: the tests run 8's time limit cut that
#       its output names)
#   source .devdeps/env.sh && PART=next bash benchmarks/gpu_s13.sh   (1 x H200, for the next session, ~6 minutes:
#       exp_gemm_gluon_fp4_convert.py (the MoE GEMM's conversion in a warpgroup of its own), every mini-deepgemm GPU
#       test on the final routes (last full run: run 3), the benchmark table with the masked 64-token route,
#       exp_weight_stream.py (does the masked GEMM's 32-byte-per-row step cap its weight bandwidth?), and
#       bench_flashmla's decode with batch 8 and 32 (the split Triton route against the Gluon kernel unsplit), and
#       bench_topk with 4- and 2-bit radix digits)
#   source .devdeps/env.sh && PART=next2 bash benchmarks/gpu_s13.sh  (1 x H200, optional after next: the indexer's
#       per-query path (decode, batch 64 / 256, 65,536 keys each) at key tiles 64-256, warps, stages, and the
#       attention kernel with QK^T duplicated per consumer warpgroup (exp_flashmla_gluon_dup_qk.py); ~3 minutes)
#   source .devdeps/env.sh && PART=masked bash benchmarks/gpu_s13.sh   (1 x H200: the masked FP4 GEMM's token tile,
#       16 / 32 / 64 x 3 / 4 stages, at 8 and 32 expected rows per expert)
#   source .devdeps/env.sh && PART=r7 bash benchmarks/gpu_s13.sh   (1 x H200: test_gemm_gluon.py, then every single-GPU
#       test of runtime/tests and integration_tests on CUDA (-n 16), then the offline example)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s13
case "${PART:-ws}" in
ws)
  run fp4_ws 300 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py"
  run gluon_tests 120 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run flashmla_decode 60 bash -c "cd benchmarks && BENCH_PARTS=decode python3 bench_flashmla.py"
  cat "$OUT/summary.txt"; tail -14 "$OUT/fp4_ws.txt"; tail -3 "$OUT/gluon_tests.txt"; tail -5 "$OUT/flashmla_decode.txt"
  ;;
r3)
  run fp4_ws 200 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py"
  run deepgemm_tests 200 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-deepgemm/tests -m gpu
  run flashmla_decode 90 bash -c "cd benchmarks && BENCH_PARTS=decode python3 bench_flashmla.py"
  run indexer_tiles 200 bash -c "cd benchmarks && python3 exp_indexer_tiles.py"
  run deepgemm 150 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  cat "$OUT/summary.txt"; tail -6 "$OUT/fp4_ws.txt"; tail -4 "$OUT/deepgemm_tests.txt"; tail -5 "$OUT/flashmla_decode.txt"
  tail -15 "$OUT/indexer_tiles.txt"; tail -30 "$OUT/deepgemm.txt"
  ;;
r4)
  run gemm_gluon 60 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run flashmla_tests 120 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-flashmla/tests -m gpu
  run flashmla 60 bash -c "cd benchmarks && python3 bench_flashmla.py"
  run prefill 100 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run decode 90 python3 benchmarks/bench_decode.py --preset medium --batches 8,64 --contexts 1024 \
    --out "$OUT/decode_medium_h200.json"
  cat "$OUT/summary.txt"; tail -3 "$OUT/gemm_gluon.txt"; tail -4 "$OUT/flashmla_tests.txt"; tail -12 "$OUT/flashmla.txt"
  tail -28 "$OUT/prefill.txt"; tail -10 "$OUT/decode.txt"
  ;;
r5)
  run few_rows 240 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --few-rows"
  cat "$OUT/summary.txt"; tail -5 "$OUT/few_rows.txt"
  ;;
r6)
  run gemm_gluon 90 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run prefill 100 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  cat "$OUT/summary.txt"; tail -3 "$OUT/gemm_gluon.txt"; tail -28 "$OUT/prefill.txt"
  ;;
masked)
  run masked_tiles 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py"
  cat "$OUT/summary.txt"; tail -6 "$OUT/masked_tiles.txt"
  ;;
r7)
  run gemm_gluon 60 python3 -m pytest -q -rs -p no:cacheprovider -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run tests_runtime 450 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning \
    runtime/tests integration_tests -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run offline 45 python3 runtime/examples/offline_inference.py
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/tests_runtime.txt" | tail -25; tail -4 "$OUT/offline.txt"
  ;;
rest)
  run rest_quick 45 python3 -m pytest -q -rs -p no:cacheprovider -n 4 runtime/tests/test_hyper_connections.py \
    runtime/tests/test_reference_model.py::test_golden_logits_of_the_tiny_checkpoint -k "cuda-1-128 or golden"
  run rest_dp 150 python3 -m pytest -q -rs -p no:cacheprovider -n 2 \
    runtime/tests/test_llm_text_and_data_parallel.py::test_text_prompts_on_two_data_parallel_ranks \
    runtime/tests/test_parallel_engine.py::test_two_data_parallel_ranks_match_single_process_engine
  cat "$OUT/summary.txt"; tail -3 "$OUT/rest_quick.txt"; tail -3 "$OUT/rest_dp.txt"
  ;;
next)
  run fp4_convert 140 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_convert.py"
  run deepgemm_tests 100 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-deepgemm/tests -m gpu
  run deepgemm 90 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  run weight_stream 80 bash -c "cd benchmarks && python3 exp_weight_stream.py"
  run flashmla_decode 45 bash -c "cd benchmarks && BENCH_PARTS=decode python3 bench_flashmla.py"  # + batch 8, 32
  run topk_tests 60 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-flashmla/tests/test_topk_exact.py
  run topk 80 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"  # + 4- and 2-bit radix digits
  cat "$OUT/summary.txt"; tail -8 "$OUT/fp4_convert.txt"; tail -4 "$OUT/deepgemm_tests.txt"; tail -30 "$OUT/deepgemm.txt"
  tail -8 "$OUT/weight_stream.txt"; tail -6 "$OUT/flashmla_decode.txt"; tail -3 "$OUT/topk_tests.txt"; tail -14 "$OUT/topk.txt"
  ;;
next2)
  run indexer_per_query 120 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  run attn_dup_qk 200 bash -c "cd benchmarks && python3 exp_flashmla_gluon_dup_qk.py"
  cat "$OUT/summary.txt"; tail -14 "$OUT/indexer_per_query.txt"; tail -16 "$OUT/attn_dup_qk.txt"
  ;;
esac
pack_out
