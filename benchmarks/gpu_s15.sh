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
#   Run 6 ran a by-name selection of run 5's unreached tests that collected nothing (commit 96e7bc5 has it; see the log).
#   source .devdeps/env.sh && PART=r7 bash benchmarks/gpu_s15.sh   (1 x H200: the 1-GPU prefill step (the MoE gate on
#       the fp32-linear kernel at 4,096 tokens per layer), then the medium model's decode at batch 64, 131k)
#   source .devdeps/env.sh && PART=next bash benchmarks/gpu_s15.sh (for the next session, 1 x H200, ~6 minutes, never
#       run: exp_gemm_masked_tiles.py --convert and exp_gemm_gluon_fp4_ws.py --convert (the FP4 GEMMs' weight
#       conversion in the byte-pair and folded-scale forms, bitwise against the shipped one, masked decode and
#       warp-specialized prefill; edited copies of gemm_gluon_kernel, the package unchanged), then every
#       mini-deepgemm GPU test)
#   source .devdeps/env.sh && PART=r8 bash benchmarks/gpu_s15.sh   (1 x H200: decode at batch 32 and 64, 131k, with
#       an 8 GB KV budget and bench_decode's new full-batch guard: run 7's batch 64 again, valid this time)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s15
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
r7)
  run prefill 130 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run decode_b64 100 python3 benchmarks/bench_decode.py --preset medium --batches 64 --contexts 131072 \
    --out "$OUT/decode_medium_b64_h200.json"
  cat "$OUT/summary.txt"; tail -28 "$OUT/prefill.txt"; grep -E "ms/step" "$OUT/decode_b64.txt"
  ;;
r8)
  run decode_b32_b64 150 python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
    --kv-cache-gb 8 --out "$OUT/decode_medium_b32_b64_h200.json"
  cat "$OUT/summary.txt"; grep -E "ms/step|bench_decode:" "$OUT/decode_b32_b64.txt"
  ;;
next)
  run convert 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --convert"
  run convert_ws 180 bash -c "cd benchmarks && python3 exp_gemm_gluon_fp4_ws.py --convert"
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  cat "$OUT/summary.txt"; tail -6 "$OUT/convert.txt"; tail -8 "$OUT/convert_ws.txt"
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/deepgemm_tests.txt" | tail -8
  ;;
esac
pack_out
