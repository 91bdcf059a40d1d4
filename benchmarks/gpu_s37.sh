#!/usr/bin/env bash
# Session 37's GPU runs (docs/reports/gpu-session-2026-12-03-s37.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s37.sh   (1 x H200, tree = main + session 36's prepared
#       3f1e1be (both expands collapse their output); .ab-alt.tar.gz = main + 521b64f (the attention expand only),
#       .ab-base.tar.gz = main: the hyper-connection GPU tests, the runtime's core GPU tests, bench_prefill on new,
#       alt and base, bench_decode on new and base)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s37.sh   (1 x H200, tree = run 1's + explicit FMAs in the hc
#       kernels: the hyper-connection GPU tests, the runtime's core GPU tests, exp_moe_contiguous_small, bench_prefill,
#       the rest of the runtime's GPU suite)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s37.sh   (1 x H200: Nsight Compute on the contiguous MoE
#       kernel at one GPU's prefill shape (384 experts of 32-96 rows, w13), whole and without its conversion or MMAs)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s37.sh   (1 x H200, tree = run 2's + the contiguous MoE
#       kernel's padding-half tiles split between both math warpgroups; .ab-base.tar.gz = run 2's tree: the
#       mini-deepgemm GPU suite, bench_fp4_e4m3_route and bench_prefill on new and base, the runtime's core GPU tests)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s37.sh   (1 x H200, the final tree; .ab-base.tar.gz =
#       b740a38 (the session's start): bench_decode on new and base)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s37
case "${PART:-r1}" in
r1)
  run hc_tests 40 $PYTEST -n 8 runtime/tests/test_hyper_connections.py runtime/tests/test_hyper_connections_strides.py \
    -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 80 new
  prefill_sides 50 alt base
  decode_bench decode_new
  decode_bench decode_base env PYTHONPATH="$(side_path base)"
  cat "$OUT/summary.txt"; test_summary hc_tests runtime_tests
  show_sides new alt base
  grep -E "^(hc|projections|moe experts) " "$OUT"/prefill_{new,alt,base}.txt
  grep -hE "ms/step|batch" "$OUT"/decode_*.txt | head -8
  ;;
r2)
  run hc_tests 40 $PYTEST -n 8 runtime/tests/test_hyper_connections.py runtime/tests/test_hyper_connections_strides.py \
    -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run exp_moe_small 170 env OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_contiguous_small.py"
  prefill_sides 80 new
  run runtime_rest 150 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16
  cat "$OUT/summary.txt"; test_summary hc_tests runtime_tests runtime_rest
  show_sides new
  grep -E "^(hc|projections|moe experts) " "$OUT"/prefill_new.txt
  grep -E "^(==|   )" "$OUT/exp_moe_small.txt"
  ;;
r3)
  NCU_SECS=80 ncu_profile moe384_w13_fold128 moe384_w13_fold128_no_convert moe384_w13_fold128_no_mma
  cat "$OUT/summary.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -120
  ;;
r4)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  route_sides 70 new base
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 80 new
  prefill_sides 50 base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  show_sides new base
  grep -E "^(moe experts|hc) " "$OUT"/prefill_{new,base}.txt
  for side in new base; do echo "== route $side"; grep -E "contiguous|masked" "$OUT/route_$side.txt" | head -12; done
  ;;
r5)
  decode_bench decode_new
  decode_bench decode_base env PYTHONPATH="$(side_path base)"
  cat "$OUT/summary.txt"
  grep -hE "zos=1 graphs=1" "$OUT"/decode_new.txt "$OUT"/decode_base.txt
  ;;
esac
pack_out
