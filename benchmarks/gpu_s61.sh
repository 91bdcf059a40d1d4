#!/usr/bin/env bash
# Session 61's GPU runs (an H100 each time: H200s could not be started). Runs 1-3 came from one machine:
#   run 1: gpu_s60.sh r3 (DEADLINE=500): b8f12bf's and a2d2f77's persistent kernels against main's, PDL's decode
#       (its decode parts hit their 30 s limits on this card), the tree's Gluon tests, the runtime's core GPU tests
#       on main's kernel, the trace;
#   run 2 (by hand; PART=decode_ab SIDES="base mid" repeats it with 60 s limits, a part took ~37 s): the decode part
#       on main (4b75e81) and dc9d46b (the merge with PDL, triggered at the attention kernel's start);
#   run 3 (by hand; PART=prefill SIDES=base): bench_prefill on main's kernel.
#   PART=late, not run (too little device time was left to start a machine): the tree = dc21ace (the merge's PDL
#       trigger at the end of the attention's block loop), .ab-base.tar.gz = 4b75e81, .ab-mid.tar.gz = dc9d46b; the
#       decode part on the tree and main, the tree's Gluon tests, the producer sleeping 0-700 ns after finding tile 0
#       free (exp_flashmla_yield.py, prepared in session 60; the prefill path is main's), on an H200
#       test_gemm_fp4_e4m3.py and test_cuda_decode.py (the capture fix; H100s only so far), then dc9d46b's decode
#       part (~450 s in all on an H200; DEADLINE=550).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s61
case "${PART:-late}" in
decode_ab) decode_parts 60 ${SIDES:-base mid} ;;
prefill) prefill_sides 170 ${SIDES:-base} ;;
late)
  decode_parts 60 new base
  fits 45 && run flashmla_tests 60 $PYTEST -n 16 packages/mini-flashmla/tests/test_kernels.py -k gluon \
    --junitxml="$OUT/junit_flashmla.xml"
  test_summary flashmla_tests
  fits 130 && run yield 120 bash -c "cd benchmarks && python3 exp_flashmla_yield.py"
  if [ "$CARD" = h200 ]; then  # owed on an H200 since session 59 (H100s only so far)
    fits 130 && fp4_e4m3_tests 120
    fits 70 && run cuda_decode_tests 60 $PYTEST -n 8 runtime/tests/test_cuda_decode.py \
      --junitxml="$OUT/junit_cuda_decode.xml"
    test_summary fp4_e4m3_tests cuda_decode_tests
  fi
  decode_parts 60 mid
  tail -30 "$OUT/yield.txt" 2>/dev/null
  ;;
esac
cat "$OUT/summary.txt"
grep -H "^| decode batch [0-9]* \(graph\|, Gluon\)" "$OUT"/decode_part_*.txt 2>/dev/null | cut -c1-150
