#!/usr/bin/env bash
# Session 34's GPU runs (docs/reports/gpu-session-2026-12-03-s34.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s34.sh   (1 x H200, tree = session 33's prepared converter
#       change (075c2b7 cherry-picked: the FP4 -> e4m3 converter's second selector by IMAD.HI); .ab-base.tar.gz = the
#       commit before it: the mini-deepgemm GPU suite, the runtime's core GPU tests, bench_fp4_e4m3_route and
#       bench_prefill on new and base; exp_alu_rates.py with its alternating pairs and POPC (session 33's r5))
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s34.sh   (1 x H200, tree = the top-k's rows held in registers;
#       .ab-base.tar.gz = 46bae5f (before it): the mini-flashmla GPU suite, the runtime's core GPU tests, bench_topk,
#       bench_prefill and bench_decode on new and base)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s34.sh   (1 x H200, tree = run 2's kernel with rows held in
#       registers no longer split into chunks; .ab-base.tar.gz = 46bae5f: the mini-flashmla GPU suite, the runtime's
#       core GPU tests and the rest of its GPU suite, bench_decode on new and base, bench_topk)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s34.sh   (1 x H200, tree = 7b7a6da (the ratio-1 layers'
#       131,072-key rows split into two chunks held in registers); .ab-base.tar.gz = its parent: the top-k's GPU tests,
#       bench_prefill on new and base. Run 4b, on the same machine: `source benchmarks/gpu_session.sh /tmp/gpu_s34 &&
#       prefill_sides 100 new`, the new side that run 4 cut at 45 s)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s34
case "${PART:-r1}" in
r1)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  route_sides 70 new base
  prefill_sides 45 new base
  run exp_alu 100 bash -c "cd benchmarks && python3 exp_alu_rates.py"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  show_sides new base
  grep -E "^moe experts " "$OUT"/prefill_{new,base}.txt
  for side in new base; do echo "== route $side"; grep -hE "^\|" "$OUT/route_$side.txt" | head -30 | cut -c1-200; done
  grep -hE "^\|" "$OUT/exp_alu.txt"
  ;;
r2)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run bench_topk 150 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  prefill_sides 45 new base
  for side in new base; do decode_bench "decode_$side" env PYTHONPATH="$(side_path $side)"; done
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(top-k|indexer) " "$OUT"/prefill_{new,base}.txt
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  grep -vE "^\[" "$OUT/bench_topk.txt" | tail -25
  ;;
r3)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new base; do decode_bench "decode_$side" env PYTHONPATH="$(side_path $side)"; done
  run bench_topk 150 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  run runtime_rest 170 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests runtime_rest
  grep -hE "zos=1 graphs=1" "$OUT"/decode_{new,base}.txt | cut -c1-200
  grep -vE "^\[" "$OUT/bench_topk.txt" | tail -25
  ;;
r4)
  run topk_tests 60 $PYTEST -n 8 packages/mini-flashmla/tests/test_topk_exact.py -m gpu
  prefill_sides 45 new base
  cat "$OUT/summary.txt"; test_summary topk_tests
  show_sides new base
  grep -E "^(top-k|indexer) " "$OUT"/prefill_{new,base}.txt
  ;;
esac
pack_out
