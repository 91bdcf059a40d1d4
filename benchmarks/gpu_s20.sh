#!/usr/bin/env bash
# Session 20's GPU runs (docs/reports/gpu-session-2026-12-02-s20.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s20.sh   (1 x H200: the runtime's FP4 experts on
#       mini-deepgemm's FP8-MMA route, the contiguous kernel's TMA-store epilogue: the route's GPU tests, its bench
#       against the bf16 route, the runtime's core GPU tests, then bench_prefill and bench_decode with --moe-route fp8
#       and bf16 in the same run)
#       Outcome: one runtime test failed (the preemption mode's logits cosine 0.8995 against the 0.9 bar), so the
#       planned r2 (the rest of the runtime suite) did not run.
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s20.sh   (1 x H200: V4.1 dense GEMMs on the V3-recipe
#       kernels with folded operands: test_v41_fold.py and test_quant.py, bench_v41_fold.py; the runtime's core
#       tests with the engine-vs-reference cosines printed (-s); bench_prefill / bench_decode with --dense-route
#       fold and v41)
#       Outcome: the fold's batch-invariance test failed at 1 row (the V3 recipe's Triton kernel below a wave of
#       tiles gives other bits than its Gluon kernel), so r3 did not run; the runtime's core tests passed.
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s20.sh   (1 x H200: the rest of the runtime suite; not run)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s20.sh   (1 x H200: the dense fold above 64 rows only,
#       decode on the V4.1 kernels with the folded weights; the fold tests, bench_v41_fold.py at 256 and 1,024 rows,
#       the runtime's core tests, bench_decode)
#       Outcome: 6 fold tests and the core tests passed.
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s20.sh   (1 x H200: the rest of the runtime suite; cut at
#       the call's 600 s limit with ~96% passed, none failed)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s20
# decode_bench NAME [FLAG ROUTE]: bench_decode, medium model, batch 32 / 64 at 131,072 tokens, into $OUT/NAME*
decode_bench() {
  local name=$1; shift
  run "$name" 120 python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
    --kv-cache-gb 8 --profile "$@" --out "$OUT/${name}_h200.json"
}
# route_benches FLAG ROUTE...: bench_prefill and decode_bench once per route of FLAG (--moe-route, --dense-route)
route_benches() {
  local flag=$1 route; shift
  for route in "$@"; do
    run "prefill_$route" 120 python3 benchmarks/bench_prefill.py "$flag" "$route" \
      --out "$OUT/prefill_${route}_h200.json"
    decode_bench "decode_$route" "$flag" "$route"
  done
}
case "${PART:-r1}" in
r1)
  run route_tests 120 $PYTEST -n 4 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py -m gpu
  run route_bench 120 bash -c "cd benchmarks && python3 bench_fp4_e4m3_route.py"
  run runtime_tests 200 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  route_benches --moe-route fp8 bf16
  cat "$OUT/summary.txt"; grep -hE " (FAILED|ERROR) |passed|failed" "$OUT/route_tests.txt" "$OUT/runtime_tests.txt" | tail -12
  grep -E "^\| " "$OUT/route_bench.txt"; tail -2 "$OUT/route_bench.txt" | cut -c1-300
  for route in fp8 bf16; do
    echo "== prefill $route"; grep -E "tok/s|MoE|moe|expert" "$OUT/prefill_$route.txt" | cut -c1-200 | head -12
    echo "== decode $route"; grep -E "ms/step|bench_decode:" "$OUT/decode_$route.txt" | cut -c1-200
  done
  ;;
r2)
  run fold_tests 150 $PYTEST -n 4 packages/mini-deepgemm/tests/test_v41_fold.py packages/mini-deepgemm/tests/test_quant.py \
    -m gpu
  run fold_bench 150 bash -c "cd benchmarks && python3 bench_v41_fold.py"
  run runtime_tests 200 $PYTEST -s $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  route_benches --dense-route fold v41
  cat "$OUT/summary.txt"; grep -hE " (FAILED|ERROR) |passed|failed" "$OUT/fold_tests.txt" "$OUT/runtime_tests.txt" | tail -12
  grep -hE "^E  .*(Error|assert)" "$OUT/fold_tests.txt" "$OUT/runtime_tests.txt" | cut -c1-250 | head -8
  grep -E "engine vs reference|model vs reference|cosine" "$OUT/runtime_tests.txt" | cut -c1-200 | head -16
  grep -E "^\| |^M = " "$OUT/fold_bench.txt"; tail -2 "$OUT/fold_bench.txt" | cut -c1-300
  for route in fold v41; do
    echo "== prefill $route"; grep -E "tok/s|experts|projections" "$OUT/prefill_$route.txt" | cut -c1-200 | head -6
    echo "== decode $route"; grep -E "graphs=1" "$OUT/decode_$route.txt" | cut -c1-200
  done
  ;;
r4)
  run fold_tests 150 $PYTEST -n 4 packages/mini-deepgemm/tests/test_v41_fold.py runtime/tests/test_dense_fp8_fold.py -m gpu
  run fold_bench 150 bash -c "cd benchmarks && python3 bench_v41_fold.py --rows 256,1024"
  run runtime_tests 200 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_bench decode
  cat "$OUT/summary.txt"; grep -hE " (FAILED|ERROR) |passed|failed" "$OUT/fold_tests.txt" "$OUT/runtime_tests.txt" | tail -12
  grep -hE "^E  .*(Error|assert)" "$OUT/fold_tests.txt" "$OUT/runtime_tests.txt" | cut -c1-250 | head -8
  grep -E "^\| |^M = " "$OUT/fold_bench.txt"; tail -2 "$OUT/fold_bench.txt" | cut -c1-300
  grep -E "graphs=1" "$OUT/decode.txt" | cut -c1-200
  ;;
r3|r5)
  run runtime_rest 590 $PYTEST runtime/tests integration_tests -m "not multigpu" -n 16 $RUNTIME_CORE_IGNORES \
    --junitxml="$OUT/junit_rest.xml"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_rest.txt" | tail -12
  ;;
esac
pack_out
