#!/usr/bin/env bash
# Session 32's GPU runs (docs/reports/gpu-session-2026-12-03-s32.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s32.sh   (1 x H200, tree = main 5b1573d + the experiment:
#       session 31's review mend (4dcad20) on the GPU: mini-deepgemm's quantizer tests, the shared-expert / dense-fold /
#       RoPE GPU tests, the runtime's core GPU tests (with the ratio > 1 compressor's projections on linear_fp32);
#       exp_indexer_mma_headsum.py (the indexer's head sum as an MMA); bench_prefill on the tree (profiled) and on
#       .ab-base.tar.gz = 5b1573d)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s32.sh   (1 x H200, tree = the indexer's head sum as an MMA
#       shipped in mini-flashmla's kernels and the top-k's one-scan selection; .ab-mid.tar.gz = aba5d91 (the head sum
#       only), .ab-base.tar.gz = 7db45be (neither): the mini-flashmla GPU suite, the runtime's core GPU tests and the
#       rest of its GPU suite; bench_flashmla and bench_decode on new and base, bench_prefill on all three)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s32.sh   (1 x H200, tree = run 2's source with the review's
#       comment and static-assert mend (the same SASS offline); .ab-base.tar.gz = 7db45be: mini-flashmla's kernel and
#       top-k GPU tests, exp_moe_sign_layout.py (the contiguous MoE conversion on sign-permuted weights), bench_topk.py on new
#       and base, exp_indexer_tiles.py --per-query (the per-query launch re-swept with the MMA head sum))
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s32
case "${PART:-r1}" in
r1)
  run quant_tests 40 $PYTEST -n 4 packages/mini-deepgemm/tests/test_quant.py -m gpu
  run shared_tests 50 $PYTEST -s runtime/tests/test_shared_expert.py runtime/tests/test_dense_fp8_fold.py \
    runtime/tests/test_rope.py -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run exp_headsum 200 bash -c "cd benchmarks && python3 exp_indexer_mma_headsum.py"
  run prefill_new 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  prefill_sides 45 base
  cat "$OUT/summary.txt"; test_summary quant_tests shared_tests runtime_tests
  grep -hE "^\||^shipped" "$OUT/exp_headsum.txt" | cut -c1-200
  show_sides new base
  grep -E "^(indexer|compressor) " "$OUT"/prefill_{new,base}.txt
  ;;
r2)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run runtime_rest 150 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  for side in new base; do  # the indexer part of bench_flashmla (scores, top-k, both chunked)
    run "flashmla_$side" 60 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=indexer \
      BENCH_JSON="flashmla_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  run prefill_new 45 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  prefill_sides 40 mid base
  for side in new base; do
    run decode_$side 45 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      --batches 32,64 --contexts 131072 --kv-cache-gb 8 --out "$OUT/decode_${side}_h200.json"
  done
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests runtime_rest
  grep -hE "indexer|top-k" "$OUT"/flashmla_{new,base}.txt | cut -c1-200
  show_sides new mid base
  grep -E "^(indexer|top-k) " "$OUT"/prefill_{new,mid,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  ;;
r3|r3s)  # r3s: the tests and the MoE experiment only (the device time left after refusals)
  run flashmla_tests 60 $PYTEST -n 8 packages/mini-flashmla/tests/test_topk_exact.py \
    packages/mini-flashmla/tests/test_kernels.py -m gpu
  run exp_sign_layout 120 bash -c "cd benchmarks && python3 exp_moe_sign_layout.py"
  [ "$PART" = r3s ] && { cat "$OUT/summary.txt"; test_summary flashmla_tests
    grep -hE "^\|" "$OUT/exp_sign_layout.txt" | cut -c1-200; pack_out; exit 0; }
  for side in new base; do
    run "topk_$side" 45 env PYTHONPATH="$(side_path $side)" OUT="$OUT/topk_$side" \
      bash -c "mkdir -p \$OUT && cd benchmarks && python3 bench_topk.py"
  done
  run exp_per_query 90 bash -c "cd benchmarks && python3 exp_indexer_tiles.py --per-query"
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  grep -hE "^\|" "$OUT/exp_sign_layout.txt" | cut -c1-200
  grep -hE "ms|top" "$OUT"/topk_{new,base}.txt | tail -20 | cut -c1-200
  grep -hE "^\|" "$OUT/exp_per_query.txt" | head -16 | cut -c1-200
  ;;
esac
pack_out
