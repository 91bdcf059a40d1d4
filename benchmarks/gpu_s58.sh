#!/usr/bin/env bash
# Session 58's GPU runs (docs/reports/gpu-session-2026-12-05-s58.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && DEADLINE=560 PART=r1 bash benchmarks/gpu_s58.sh   (1 GPU; tree = main 30bdf46, session
#       57's prepared fixes: the FP8-MMA route's packed-weight descriptors built per call, DecodeGraphs capturing with
#       the cyclic collector off; .ab-alt.tar.gz = main 07c611f, without them; .ab-mid.tar.gz = main 1036a66, before
#       session 57's attention changes; .ab-base.tar.gz = main 13c3ba6, before session 56's): test_gemm_fp4_e4m3.py,
#       test_cuda_decode.py on the tree and on 07c611f (its new capture test should fail there), the runtime's core
#       GPU tests; on an H200 also the figures sessions 56-57 owe (bench_flashmla, bench_prefill with seven layers)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s58
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 150
  run cuda_decode_new 90 $PYTEST -n 4 runtime/tests/test_cuda_decode.py --junitxml="$OUT/junit_cuda_decode_new.xml"
  run cuda_decode_alt 60 env PYTHONPATH="$(side_path alt)" $PYTEST runtime/tests/test_cuda_decode.py \
    -k "dead_engines_graphs"
  fits 150 && run runtime_tests 140 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  if grep -q H200 "$OUT/env.txt"; then
    fits 200 && flashmla_sides 90 new base
    fits 110 && prefill_sides 95 new
  fi
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests cuda_decode_new cuda_decode_alt runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*.txt | cut -c1-200; show_sides new base
  ;;
esac
pack_out
