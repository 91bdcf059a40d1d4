#!/usr/bin/env bash
# Session 57's GPU runs (docs/reports/gpu-session-2026-12-05-s57.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && DEADLINE=560 PART=r1 bash benchmarks/gpu_s57.sh   (1 GPU; tree = main 1036a66,
#       .ab-base.tar.gz = main 13c3ba6, before session 56's producer conversions): on an H200 the figures session 56
#       owes (bench_flashmla and bench_prefill on both sides), then the rest of the runtime suite (parts A and B,
#       not run in session 56); on an H100 the rest of the suite and the paged prefill kernel's profile
#   PART=r2 (tree = the quantized producer's chunk loop reordered: a chunk's staged words loaded before the next
#       copies are issued, the ids of the chunk after them loaded first and turned into rows after the conversion;
#       .ab-mid.tar.gz = the ids' order alone; .ab-base.tar.gz = main 1036a66): mini-flashmla's GPU suite, the
#       outputs' hash on the three sides, bench_flashmla on the three sides, the runtime's core GPU tests,
#       bench_prefill on the tree and the base, the tree's paged prefill profile
#   PART=r3 (tree = run 2's tree with the next chunk's words loaded into registers before this chunk's tile stores;
#       .ab-mid.tar.gz = run 2's tree, main 5829942; .ab-base.tar.gz = main 1036a66; .ab-alt.tar.gz = main 13c3ba6,
#       before session 56): mini-flashmla's GPU suite, the outputs' hash, bench_flashmla on the four sides (on an H200
#       the figures sessions 56-57 owe), the runtime's core GPU tests (run 2's capture error again?), bench_prefill on
#       the tree and run 2's
#   PART=r4 (tree = main 5829942 with the staging ring as two allocations, even and odd chunks, so that Gluon's
#       barrier analysis no longer puts a partition barrier between a chunk's shared loads and the next copies;
#       .ab-mid.tar.gz = main 5829942, the session's final tree if this loses): mini-flashmla's GPU suite, the
#       outputs' hash, bench_flashmla on both sides, the runtime's core GPU tests on both sides, bench_prefill on both
#   PART=r5 (trees as run 4; the session's last device time): bench_flashmla's prefill part only, four times,
#       alternating sides and starting with run 4's second side (its first side and an unchanged kernel moved 2%)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s57
case "${PART:-r1}" in
r1)
  if grep -q H200 "$OUT/env.txt"; then
    flashmla_sides 110 new base
    fits 200 && prefill_sides 95 new base
    fits 150 && rest_ab 70 130
  else
    rest_ab 75 140
    fits 200 && ncu_profile sparse_prefill
  fi
  cat "$OUT/summary.txt"; show_sides new base; test_summary runtime_rest_a runtime_rest_b
  grep -h "^FAILED\|^ERROR" "$OUT"/*rest*.txt | cut -c1-200
  ;;
r2)  # DEADLINE=570
  flashmla_tests 150
  hash_sides new mid base
  fits 250 && flashmla_sides 100 new mid base
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 110 && prefill_sides 50 new base
  fits 40 && ncu_profile sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "sha256" "$OUT"/hash_*.txt; show_sides new mid base
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r3)  # DEADLINE=560
  flashmla_tests 150
  run hash_new 60 python3 benchmarks/attn_output_hash.py
  fits 300 && flashmla_sides 100 new mid base alt
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 120 && prefill_sides 55 new mid
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "sha256" "$OUT"/hash_*.txt; show_sides new mid base alt
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r4)  # DEADLINE: the device time left
  flashmla_tests 120
  run hash_new 60 python3 benchmarks/attn_output_hash.py
  fits 230 && flashmla_sides 100 new mid
  for side in mid new; do
    fits 80 && run "runtime_tests_$side" 100 env PYTHONPATH="$(side_path $side)" $PYTEST $RUNTIME_CORE_TESTS \
      -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime_$side.xml"
  done
  fits 45 && prefill_sides 30 new mid
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests_mid runtime_tests_new
  grep -h "sha256" "$OUT"/hash_*.txt; show_sides new mid
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests*.txt | cut -c1-200
  ;;
r5)  # DEADLINE: the device time left
  for i in 1 2; do
    for side in mid new; do
      fits 35 && run "prefill_part_${side}_$i" 40 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=prefill \
        BENCH_JSON="flashmla_${side}_$i.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
    done
  done
  cat "$OUT/summary.txt"; grep -H "^| prefill" "$OUT"/prefill_part_*.txt | cut -c1-140
  ;;
esac
pack_out
