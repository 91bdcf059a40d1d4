#!/usr/bin/env bash
# Session 60's GPU runs: none ran. The first call's machine was taken back before it finished, ten more could not
# start one (H200 and H100 alike) and nine came during cool-downs: ~1,640 s of device time, and what was left could
# not start another machine. Every part below is prepared for the next session. Sides, made before the call:
#   the tree: `git revert 14d9b0b` (b8f12bf's kernel: one program per SM taking every 132nd item where the block count
#       is even, the next item's Q loaded under the last PVs, the outputs stored from an in-warp transposed layout);
#   .ab-alt.tar.gz: `git archive -o .ab-alt.tar.gz a2d2f77 packages/*/src runtime/src` (the persistent programs alone,
#       outputs staged in Q's shared memory);
#   .ab-base.tar.gz: the same of 4b75e81 (main's kernel: the staged epilogue; later commits change no kernel);
#   .ab-mid.tar.gz: the same of dc9d46b (main's kernel with the split decode's merge launched with PDL).
# carry [".devdeps", ".ab-alt.tar.gz", ".ab-base.tar.gz", ".ab-mid.tar.gz"]; each part takes 6-40 s (session 59 run 6).
#   source .devdeps/env.sh && DEADLINE=550 PART=r3 bash benchmarks/gpu_s60.sh   (1 GPU): session 59's run 8
#       (gpu_s59.sh r8) grown into one call: the outputs' hash on the tree, alt and main, the prefill part twice per
#       side in turn, the decode part on the tree, main and pdl, the tree's mini_flashmla Gluon tests, the runtime's
#       core GPU tests on main's kernel (owed since session 59's staged epilogue), the trace where time is left.
#   DEADLINE=220 PART=r4: the smallest form of r3 (the hashes, the prefill part twice per side, the decode part on the
#       tree, main and pdl), for when little device time is left.
#   DEADLINE=560 PART=r2 (the tree = the kernel shipped after r3 or r4, .ab-base.tar.gz = 4b75e81): mini_flashmla's
#       GPU suite, the runtime's core GPU tests, bench_prefill on the tree and main, then the producer sleeping after
#       finding tile 0 free, 0-700 ns (benchmarks/exp_flashmla_yield.py, on the tree's kernel).
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s60
# the A/B of r3 and r4: the hashes, the prefill part twice per side in turn, the decode part on the tree, main and pdl
persistent_and_pdl_ab() {
  hash_sides new alt base
  prefill_part_rounds 2 base alt new
  decode_parts 30 new base mid
}
show_ab() {
  grep -h sha256 "$OUT"/hash_*.txt
  grep -H "^| prefill_\(paged\|bf16\)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-110
  grep -H "^| decode batch [0-9]* (graph" "$OUT"/decode_part_*.txt | cut -c1-120
}
case "${PART:-r3}" in
r3)
  persistent_and_pdl_ab
  fits 100 && run flashmla_tests 90 $PYTEST -n 16 packages/mini-flashmla/tests/test_kernels.py -k gluon \
    --junitxml="$OUT/junit_flashmla.xml"
  fits 120 && run runtime_tests 110 env PYTHONPATH="$(side_path base)" $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" \
    -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 40 && run trace 30 bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests; show_ab
  ;;
r4)
  persistent_and_pdl_ab
  cat "$OUT/summary.txt"; show_ab
  ;;
r2)
  flashmla_tests 120
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 200 && prefill_sides 95 new base  # three sample layers at 4,096 tokens where seven do not fit (an H100)
  fits 60 && run yield 100 bash -c "cd benchmarks && python3 exp_flashmla_yield.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  show_sides new base; cat "$OUT/yield.txt" | tail -40
  ;;
esac
pack_out
