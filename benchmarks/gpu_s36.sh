#!/usr/bin/env bash
# Session 36's GPU runs (docs/reports/gpu-session-2026-12-03-s36.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s36.sh   (1 x H200, tree = session 35's review mend of the
#       top-k plus its three prepared changes (wo_a as one bmm into z's layout, the rounds' raw packed-compare sums,
#       the candidate blocks held in registers and appended); .ab-base.tar.gz = d4441b4 (main): the mini-flashmla GPU
#       suite, the runtime's core GPU tests, bench_topk and bench_prefill on new and base)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s36.sh   (1 x H200, run 1's tree (its bench_topk calls ran out
#       of time compiling); .ab-alt.tar.gz = 06b2038 (main + wo_a as one bmm + the rounds' raw sums, without the
#       candidate blocks), .ab-base.tar.gz = d4441b4: the mini-flashmla GPU suite, bench_topk's levels, blocks and
#       decode parts and bench_prefill on new, alt and base)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s36.sh   (1 x H200, tree = main + wo_a as one bmm + the
#       rounds' raw sums + the append pass's offsets summed in int32 + the fused expand / mixes / collapse pass;
#       .ab-alt.tar.gz = the same without the fused pass: the mini-flashmla GPU suite, the hyper-connection GPU tests,
#       the runtime's core GPU tests, bench_hc_expand_mix and bench_prefill on new and alt)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s36
case "${PART:-r1}" in
r1)
  run flashmla_tests 100 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run bench_topk 130 python3 benchmarks/bench_topk.py --out "$OUT/bench_topk.json"
  run bench_topk_base 130 env PYTHONPATH="$(side_path base)" python3 benchmarks/bench_topk.py \
    --out "$OUT/bench_topk_base.json"
  prefill_sides 90 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(top-k|indexer|projections) " "$OUT"/prefill_{new,base}.txt
  for f in bench_topk bench_topk_base; do echo "== $f"; grep -vE "^\[" "$OUT/$f.txt" | tail -22; done
  ;;
r2)
  run flashmla_tests 150 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  for side in new alt base; do
    run "bench_topk_$side" 100 env PYTHONPATH="$(side_path $side)" BENCH_TOPK_PARTS=levels,blocks,decode \
      python3 benchmarks/bench_topk.py --out "$OUT/bench_topk_$side.json"
  done
  prefill_sides 70 new alt base
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new alt base
  grep -E "^(top-k|indexer|projections) " "$OUT"/prefill_{new,alt,base}.txt
  for side in new alt base; do echo "== $side"; grep -vE "^\[" "$OUT/bench_topk_$side.txt" | tail -12; done
  ;;
r3)
  run flashmla_tests 130 $PYTEST -n 8 packages/mini-flashmla/tests -m gpu
  run hc_tests 70 $PYTEST -n 8 runtime/tests/test_hyper_connections.py runtime/tests/test_hyper_connections_strides.py \
    -m gpu
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run bench_hc_expand_mix 70 bash -c \
    "cd benchmarks && python3 bench_hc_expand_mix.py --out $OUT/bench_hc_expand_mix.json"
  prefill_sides 95 new
  prefill_sides 60 alt
  cat "$OUT/summary.txt"; test_summary flashmla_tests hc_tests runtime_tests
  show_sides new alt
  grep -E "^(top-k|indexer|projections|hc) " "$OUT"/prefill_{new,alt}.txt
  grep -E "^\|" "$OUT/bench_hc_expand_mix.txt"
  ;;
esac
pack_out
