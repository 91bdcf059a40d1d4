#!/usr/bin/env bash
# Session 16's GPU runs (docs/reports/gpu-session-2026-12-01-s16.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s16.sh   (1 x H200: session 15's prepared `PART=next`:
#       exp_gemm_masked_tiles.py --convert and exp_gemm_gluon_fp4_ws.py --convert (byte-pair and folded-scale weight
#       conversions, edited copies of gemm_gluon_kernel, bitwise against the shipped one), every mini-deepgemm GPU
#       test, and test_topk_exact.py (session 15's review change to _chunked_topk, its strided test))
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s16.sh   (1 x H200: exp_gemm_gluon_v41_waits.py (the V4.1
#       kernel's staggered and rolling MMA waits, bitwise against the shipped kernel); the FP4 GEMMs' byte-pair
#       conversion, shipped after run 1: every mini-deepgemm GPU test (with the new conversion-exactness test) and
#       bench_deepgemm.py --graph; the numpy StepTensors.build (branch host-block-tables, cherry-picked) and the
#       new conversion under the CUDA runtime's decode tests and both integration files; bench_step_tensors.py on
#       that machine's CPU)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s16.sh   (1 x H200: the folded FP4 conversion, shipped after
#       run 2 as an option (weight_scale_max): exp_gemm_masked_tiles.py --convert (fold, early ring refill, both),
#       exp_gemm_gluon_fp4_ws.py --convert (fold), every mini-deepgemm GPU test, the runtime's MoE GPU tests (the
#       engine passes its load-time bound, so it folds) and decode tests, then the medium model's decode at batch 32
#       and 64, 131k, 8 GB KV)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s16.sh   (1 x H200: test_gemm_gluon.py after its fix (run 3's
#       failure was the test's own data: scale bytes up to 131 under a <= 128 assertion), bench_deepgemm.py --graph
#       with checkpoint-like FP4 scales and the stated bound (the engine's folded path), the 1-GPU prefill step, the
#       offline example)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s16.sh   (1 x H200: exp_gemm_masked_tiles.py --weight-tiles: the
#       masked GEMM at 64 / 128 weight rows per CTA and 3-6 stages, folded, bitwise against the routed config)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s16.sh   (1 x H200: every runtime and integration test that run
#       3 did not run, on the final tree: the engine folds its FP4 MoE conversion and builds step tensors with numpy)
#   source .devdeps/env.sh && PART=next bash benchmarks/gpu_s16.sh (for the next session, 1 x H200, ~2 minutes, never
#       run: exp_gemm_masked_tiles.py --occupancy: the masked FP4 GEMM with ptxas register caps 72 / 64 (7 / 8 CTAs
#       per SM instead of 6) at 3 and 4 stages, folded, bitwise against the routed config)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s16
case "${PART:-r1}" in
r1)
  run convert 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --convert"
  run convert_ws 180 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --convert"
  run topk_tests 60 $PYTEST -n 4 packages/mini-flashmla/tests/test_topk_exact.py
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  cat "$OUT/summary.txt"; tail -6 "$OUT/convert.txt"; tail -8 "$OUT/convert_ws.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/topk_tests.txt" "$OUT/deepgemm_tests.txt" | tail -10
  ;;
r2)
  run v41_waits 200 bash -c "cd benchmarks && python3 exp_gemm_gluon_v41_waits.py"
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  run runtime_decode 200 $PYTEST runtime/tests/test_cuda_decode.py runtime/tests/test_decode_path.py \
    integration_tests/test_model_vs_reference.py integration_tests/test_engine_vs_reference.py -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime_decode.xml"
  run step_tensors 30 python3 benchmarks/bench_step_tensors.py
  cat "$OUT/summary.txt"; tail -10 "$OUT/v41_waits.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/deepgemm_tests.txt" "$OUT/runtime_decode.txt" | tail -12
  grep -E "masked|contiguous|geomean" "$OUT/deepgemm.txt" | tail -12; tail -6 "$OUT/step_tensors.txt"
  ;;
r3)
  run convert 120 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --convert"
  run convert_ws 120 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --convert"
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 200 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run decode_b32_b64 150 python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
    --kv-cache-gb 8 --profile --out "$OUT/decode_medium_b32_b64_h200.json"
  cat "$OUT/summary.txt"; tail -6 "$OUT/convert.txt"; tail -8 "$OUT/convert_ws.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/deepgemm_tests.txt" "$OUT/runtime_tests.txt" | tail -12
  grep -E "ms/step|bench_decode:" "$OUT/decode_b32_b64.txt"
  ;;
r4)
  run gluon_tests 90 $PYTEST -n 4 packages/mini-deepgemm/tests/test_gemm_gluon.py
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  run prefill 150 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run offline 60 python3 runtime/examples/offline_inference.py
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/gluon_tests.txt" | tail -6
  grep -E "MoE|w13|w2|geomean" "$OUT/deepgemm/table.md" | tail -11; tail -28 "$OUT/prefill.txt"; tail -3 "$OUT/offline.txt"
  ;;
r5)
  run weight_tiles 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --weight-tiles"
  cat "$OUT/summary.txt"; tail -5 "$OUT/weight_tiles.txt"
  ;;
r6)
  run runtime_rest 450 $PYTEST runtime/tests integration_tests -m "not multigpu" -n 16 $RUNTIME_CORE_IGNORES \
    --junitxml="$OUT/junit_runtime_rest.xml"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_rest.txt" | tail -15
  ;;
next)
  run occupancy 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --occupancy"
  cat "$OUT/summary.txt"; tail -5 "$OUT/occupancy.txt"
  ;;
esac
pack_out
