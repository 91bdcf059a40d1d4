#!/usr/bin/env bash
# Session 46's GPU runs (docs/reports/gpu-session-2026-12-04-s46.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s46.sh   (1 x H200; tree = main with c4598dc again: the
#       folded masked loop converts the next step's first half under this step's MMAs; .ab-base.tar.gz = d947441,
#       session 45's last tree): the FP8-MMA MoE kernels' tests; exp_moe_weight_order on both sides; the runtime's
#       core GPU tests (session 45's unrun edits: the KernelWeights guard, the chunked reorder); test_sampler.py and
#       test_llm_api.py (session 49's filter fix); bench_decode on both sides (its set-up time: the chunked reorder)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s46
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 90
  script_sides 120 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  # session 49's sampler filter fix (torch code that runs on CUDA too) and request checks
  run sampler_tests 60 $PYTEST runtime/tests/test_sampler.py runtime/tests/test_llm_api.py -n 8 \
    --junitxml="$OUT/junit_sampler.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests sampler_tests
  grep -hE "^\|" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/order_new.txt" "$OUT/order_base.txt" "$OUT/decode_new.txt" | cut -c1-300
  grep -hE "model ready|graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
esac
pack_out
