#!/usr/bin/env bash
# Session 15's GPU runs (docs/reports/gpu-session-2026-12-01-s15.md); files under $OUT, packed by pack_out.
# Runs 1 and 2 were session 14's prepared `PART=next` / `PART=next2` of benchmarks/gpu_s14.sh.
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s15.sh   (1 x H200: the decode step's tail and top-k:
#       the head / MoE-gate kernel (layers/linear_fp32.py), the sliced sampler, the chunked decode top-k; their
#       tests, bench_logits_sampler.py, bench_topk.py (with its decode sweep), the medium model's decode at 32k and
#       131k context with a profile, then the runtime tests of the decode path and both integration files)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s15.sh   (1 x H200: run 3 again after its fixes: the fp32
#       linear kernel adds each K step's MMA into its accumulator in fp32 (run 3: 5.6e-6 relative L2 with chained
#       MMAs, over the test's 1e-6), the decode top-k's chunk rule from run 3's sweep)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s15.sh   (1 x H200: every other runtime and integration
#       test, the offline example)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s15.sh   (1 x H200: the tests run 5's 420 s limit did not
#       reach, by name (run 5's JUnit against the collection): the hyper-connection cases at 1 token x 128 and the
#       two data-parallel-rank tests)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s15
PYTEST="python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning"
DECODE_FILES="runtime/tests/test_cuda_decode.py runtime/tests/test_decode_path.py integration_tests/test_model_vs_reference.py
  integration_tests/test_engine_vs_reference.py"
case "${PART:-r3}" in
r3|r4)
  run tail_tests 120 $PYTEST -n 8 runtime/tests/test_linear_fp32.py runtime/tests/test_sampler.py \
    packages/mini-flashmla/tests/test_topk_exact.py packages/mini-flashmla/tests/test_kernels.py
  run logits_sampler 90 python3 benchmarks/bench_logits_sampler.py --out "$OUT/logits_sampler_h200.json"
  run topk 120 bash -c "cd benchmarks && python3 bench_topk.py --out $OUT/bench_topk.json"
  run decode_long 150 python3 benchmarks/bench_decode.py --preset medium --batches 8,32 --contexts 32768,131072 \
    --profile --out "$OUT/decode_medium_long_h200.json"
  run runtime_decode 200 $PYTEST $DECODE_FILES -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime_decode.xml"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/tail_tests.txt" | tail -8
  tail -14 "$OUT/logits_sampler.txt"; tail -9 "$OUT/topk.txt"; grep -E "ms/step" "$OUT/decode_long.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_decode.txt" | tail -10
  ;;
r5)
  ignores=""
  for f in $DECODE_FILES runtime/tests/test_linear_fp32.py runtime/tests/test_sampler.py; do ignores="$ignores --ignore=$f"; done
  run runtime_rest 420 $PYTEST runtime/tests integration_tests -m "not multigpu" -n 16 $ignores \
    --junitxml="$OUT/junit_runtime_rest.xml"
  run offline 40 python3 runtime/examples/offline_inference.py
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_rest.txt" | tail -15
  tail -3 "$OUT/offline.txt"
  ;;
r6)
  run runtime_unreached 300 $PYTEST -n 6 --junitxml="$OUT/junit_runtime_unreached.xml" \
    "runtime/tests/test_hyper_connections.py::test_fused_mixes_match_the_reference[cuda-1-128-default-bf16x3]" \
    "runtime/tests/test_hyper_connections.py::test_fused_mixes_match_the_reference[cuda-1-128-ieee]" \
    "runtime/tests/test_hyper_connections.py::test_fused_mixes_match_the_reference[cuda-1-128-small-slices]" \
    "runtime/tests/test_hyper_connections.py::test_fused_collapse_and_expand_match_the_references[cuda-1-128]" \
    runtime/tests/test_llm_text_and_data_parallel.py::test_text_prompts_on_two_data_parallel_ranks \
    runtime/tests/test_parallel_engine.py::test_two_data_parallel_ranks_match_single_process_engine
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_unreached.txt" | tail -10
  ;;
esac
pack_out
