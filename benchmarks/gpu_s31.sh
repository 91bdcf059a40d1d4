#!/usr/bin/env bash
# Session 31's GPU runs (docs/reports/gpu-session-2026-12-03-s31.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s31.sh   (1 x H200, tree = main with: the FP4 quantization
#       kernel re-applied (cf2c376), the shared expert on the fused path (9883b47), RoPE as one kernel, mini-deepgemm's
#       checks with lazy messages, the window and index-key cache rows packed by its quantizer kernels, the window
#       KV's FP8 round trip and the compressed KV's FP4 (e4m3 scales) round trip and packing as one kernel each, the
#       contiguous MoE plan in four launches;
#       .ab-alt.tar.gz = 9883b47 (no RoPE kernel), .ab-mid.tar.gz = 7ba6714 (the FP4 kernel only), .ab-base.tar.gz
#       = d2681aa (none): the mini-deepgemm GPU suite, the cache-row packing test, the shared-expert, dense-fold and
#       RoPE GPU tests, the runtime's core GPU tests, bench_fp4_quant.py, bench_rope.py; bench_prefill on the four
#       sides (with the host's Python profile on the new side) and bench_decode on new and base)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s31.sh   (1 x H200, tree = run 1's with its three failures
#       mended: the FP4 round trip's sign as a bit (-0.0), RoPE at zero tokens, the stacked shared-expert GEMM on its
#       halves' route: mini-deepgemm's quantizer tests, the shared-expert / RoPE / packing GPU tests, the runtime's core
#       GPU tests and the rest of its GPU suite; bench_fp4_quant.py, bench_rope.py (their shared table helper);
#       bench_prefill (no profiled step) and bench_decode on the tree. PART=r2t: the tests only)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s31
case "${PART:-r1}" in
r1)
  run deepgemm_tests 140 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run shared_tests 60 $PYTEST -s runtime/tests/test_shared_expert.py runtime/tests/test_dense_fp8_fold.py \
    runtime/tests/test_rope.py packages/mini-flashmla/tests/test_reference_paged.py -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run bench_fp4_quant 40 python3 benchmarks/bench_fp4_quant.py --out "$OUT/bench_fp4_quant.json"
  run bench_rope 40 python3 benchmarks/bench_rope.py --out "$OUT/bench_rope.json"
  run prefill_new 60 python3 benchmarks/bench_prefill.py --py-profile 60 --out "$OUT/prefill_new_h200.json"
  prefill_sides 45 alt mid base
  for side in new base; do  # decode_bench's arguments with a 60 s limit: the part limits stay within one call
    run decode_$side 60 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      --batches 32,64 --contexts 131072 --kv-cache-gb 8 --out "$OUT/decode_${side}_h200.json"
  done
  cat "$OUT/summary.txt"; test_summary deepgemm_tests shared_tests runtime_tests
  grep -E "^\| " "$OUT/bench_fp4_quant.txt" "$OUT/bench_rope.txt"
  show_sides new alt mid base
  grep -E "^(indexer|moe experts|projections) " "$OUT"/prefill_{new,alt,mid,base}.txt
  grep -hE "ms/step|tok/s" "$OUT/decode_new.txt" "$OUT/decode_base.txt" | head -16 | cut -c1-200
  ;;
r2|r2t)  # r2t: the tests only (a short device budget)
  run quant_tests 40 $PYTEST -n 4 packages/mini-deepgemm/tests/test_quant.py -m gpu
  run shared_tests 50 $PYTEST -s runtime/tests/test_shared_expert.py runtime/tests/test_dense_fp8_fold.py \
    runtime/tests/test_rope.py packages/mini-flashmla/tests/test_reference_paged.py -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run runtime_rest 150 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  if [ "$PART" = r2 ]; then
    run bench_fp4_quant 25 python3 benchmarks/bench_fp4_quant.py --out "$OUT/bench_fp4_quant.json"
    run bench_rope 20 python3 benchmarks/bench_rope.py --out "$OUT/bench_rope.json"
    run prefill_new 40 python3 benchmarks/bench_prefill.py --no-profile --out "$OUT/prefill_new_h200.json"
    run decode_new 40 python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
      --kv-cache-gb 8 --out "$OUT/decode_new_h200.json"
  fi
  cat "$OUT/summary.txt"; test_summary quant_tests shared_tests runtime_tests runtime_rest
  grep -hE "^\| " "$OUT/bench_fp4_quant.txt" "$OUT/bench_rope.txt" 2>/dev/null | cut -c1-160
  grep -hE "shared expert, " "$OUT/shared_tests.txt"
  grep -hE "tok/s" "$OUT/prefill_new.txt" 2>/dev/null | head -3
  grep -hE "zos=1 graphs=1" "$OUT/decode_new.txt" 2>/dev/null | cut -c1-200
  ;;
esac
pack_out
