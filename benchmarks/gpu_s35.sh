#!/usr/bin/env bash
# Session 35's GPU runs (docs/reports/gpu-session-2026-12-03-s35.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s35.sh   (1 x H200, tree = the top-k's rows held in registers
#       selected by appending their candidates (topk_kernel._select_appended); .ab-base.tar.gz = f33290d (before it):
#       the mini-flashmla GPU suite, the runtime's core GPU tests, bench_topk, bench_prefill and bench_decode on new
#       and base; exp_alu_rates.py (session 34's IMAD.HI and HSET2 cases))
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s35.sh   (1 x H200, tree = the append pass with one atomic per
#       thread and step, its loads one step ahead; .ab-base.tar.gz = f33290d: the mini-flashmla GPU suite, bench_topk,
#       bench_prefill and bench_decode on new and base, the runtime's core GPU tests)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s35.sh   (1 x H200, tree = run 2's with 8,192-value steps for
#       rows held in registers (api.TOPK_RESIDENT_BLOCK); .ab-base.tar.gz = f33290d: the mini-flashmla GPU suite,
#       bench_topk, bench_prefill on new and base, bench_decode on new, the rest of the runtime's GPU suite)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s35
case "${PART:-r1}" in
r1)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run bench_topk 150 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  prefill_sides 100 new base
  for side in new base; do decode_bench "decode_$side" env PYTHONPATH="$(side_path $side)"; done
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run exp_alu 60 bash -c "cd benchmarks && python3 exp_alu_rates.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(top-k|indexer) " "$OUT"/prefill_{new,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  grep -vE "^\[" "$OUT/bench_topk.txt" | tail -25
  grep -hE "^\|" "$OUT/exp_alu.txt"
  ;;
r2)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run bench_topk 150 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  prefill_sides 100 new base
  for side in new base; do decode_bench "decode_$side" env PYTHONPATH="$(side_path $side)"; done
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(top-k|indexer) " "$OUT"/prefill_{new,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  grep -vE "^\[" "$OUT/bench_topk.txt" | tail -25
  ;;
r3)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run bench_topk 150 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  prefill_sides 100 new base
  decode_bench decode_new env PYTHONPATH="$(side_path new)"
  run runtime_rest 170 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_rest
  show_sides new base
  grep -E "^(top-k|indexer) " "$OUT"/prefill_{new,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_new.txt | cut -c1-200
  grep -vE "^\[" "$OUT/bench_topk.txt" | tail -25
  ;;
esac
pack_out
