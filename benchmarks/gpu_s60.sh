#!/usr/bin/env bash
# Session 60's GPU runs; files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && DEADLINE=550 PART=r3 bash benchmarks/gpu_s60.sh   (1 GPU): session 59's prepared
#       run 8 (gpu_s59.sh r8; the session's first tries could not start a machine) grown into one call. The tree is
#       b8f12bf's kernel (`git revert 174e125`: one program per SM taking every 132nd item where the block count is
#       even, the next item's Q loaded under the last PVs, the outputs stored from an in-warp transposed layout);
#       .ab-alt.tar.gz = a2d2f77 (the persistent programs alone, outputs staged in Q's shared memory), .ab-base.tar.gz
#       = 4b75e81 (main's kernel: the staged epilogue), .ab-mid.tar.gz = the pdl branch (main with the split decode's
#       merge launched with PDL). The outputs' hash on the tree, alt and main, the prefill part twice per side in
#       turn, the tree's mini_flashmla Gluon tests, the decode part on the tree, main and pdl, the runtime's core GPU
#       tests on main's kernel (owed since session 59's staged epilogue), the trace where time is left.
#   DEADLINE=210 PART=r4 (r3's sides; what ~350 s of device time left allow after the refused starts): the hash on the
#       tree, alt and main, the prefill part twice per side in turn, the decode part on the tree, main and pdl (each
#       part takes 6-40 s: session 59 run 6)
#   DEADLINE=560 PART=r2 (the tree = the kernel shipped after r1, .ab-base.tar.gz = 4b75e81): mini_flashmla's GPU
#       suite, the runtime's core GPU tests, bench_prefill on the tree and main, then the producer sleeping after
#       finding tile 0 free, 0-700 ns (benchmarks/exp_flashmla_yield.py, on the tree's kernel).
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s60
case "${PART:-r3}" in
r3)
  hash_sides new alt base
  prefill_part_rounds 2 base alt new
  fits 100 && run flashmla_tests 90 $PYTEST -n 16 packages/mini-flashmla/tests/test_kernels.py -k gluon \
    --junitxml="$OUT/junit_flashmla.xml"
  for side in new base mid; do
    fits 30 && run "decode_part_$side" 30 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=decode \
      BENCH_JSON="flashmla_decode_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  fits 120 && run runtime_tests 110 env PYTHONPATH="$(side_path base)" $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" \
    -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 40 && run trace 30 bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests; grep -h sha256 "$OUT"/hash_*.txt
  grep -H "^| prefill_\(paged\|bf16\)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-110
  grep -H "^| decode batch [0-9]* (graph" "$OUT"/decode_part_*.txt | cut -c1-120
  ;;
r4)
  hash_sides new alt base
  prefill_part_rounds 2 base alt new
  for side in new base mid; do
    fits 25 && run "decode_part_$side" 30 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=decode \
      BENCH_JSON="flashmla_decode_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  cat "$OUT/summary.txt"; grep -h sha256 "$OUT"/hash_*.txt
  grep -H "^| prefill_\(paged\|bf16\)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-110
  grep -H "^| decode batch [0-9]* (graph" "$OUT"/decode_part_*.txt | cut -c1-120
  ;;
r2)
  flashmla_tests 120
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  if grep -q H200 "$OUT/env.txt"; then fits 200 && prefill_sides 95 new base
  else  # seven sample layers do not fit an H100's 80 GB
    for side in new base; do
      fits 100 && run "prefill_$side" 95 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        --tokens 4096 --layers window,r1-full,r1-reuse --out "$OUT/prefill_${side}_h100.json"
    done
  fi
  fits 60 && run yield 100 bash -c "cd benchmarks && python3 exp_flashmla_yield.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  show_sides new base; cat "$OUT/yield.txt" | tail -40
  ;;
esac
pack_out
