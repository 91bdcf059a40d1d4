#!/usr/bin/env bash
# Session 33's GPU runs (docs/reports/gpu-session-2026-12-03-s33.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s33.sh   (1 x H200, tree = main db6985c; .ab-base.tar.gz =
#       4058c1f: session 32's review mend (74ed474, the compressed KV and index keys packed before their FP4 round
#       trips) on the GPU for the first time: the runtime's core GPU tests and the rest of its GPU suite (with
#       test_reference_model.py's new packing test); bench_prefill on the tree and on 4058c1f)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s33
case "${PART:-r1}" in
r1)
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run runtime_rest 150 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  run prefill_new 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  prefill_sides 45 base
  cat "$OUT/summary.txt"; test_summary runtime_tests runtime_rest
  show_sides new base
  grep -E "^(compressor|indexer|window cache|other) " "$OUT"/prefill_{new,base}.txt
  ;;
esac
pack_out
