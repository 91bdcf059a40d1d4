#!/usr/bin/env bash
# Session 23's GPU runs (docs/reports/gpu-session-2026-12-02-s23.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s23.sh   (1 x H200, tree = branch attn-producer, baseline =
#       main's src folders in .ab-base.tar.gz, the branch's first commit (conflict-free dequantization stores only) in
#       .ab-mid.tar.gz: the mini-flashmla GPU tests; bench_flashmla (prefill, decode) on the three; the attention
#       breakdown and Nsight Compute on the paged prefill, branch; bench_prefill on branch and main; exp_moe_breakdown)
#       Outcome: 84 passed, 1 skipped; paged prefill 220.2 -> 247.2 (stores) -> 253.8 TFLOP/s (ids), decode 1.13-1.14x,
#       prefill step 595.0 -> 588.9 ms; the MoE breakdown in deepgemm-moe-fold-128.md
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s23.sh   (1 x H200, tree = attn-producer + P through shared
#       memory, .ab-mid.tar.gz = the ids-staging commit, .ab-base.tar.gz = main: the mini-flashmla GPU tests,
#       bench_flashmla on the three, the breakdown, Nsight Compute on both prefill cases, bench_prefill on tree and mid)
#       Outcome: 84 passed, 1 skipped; P through shared memory 0.97x bf16 rows, 1.00x paged (reverted); the ids staging
#       (mid) 1.00x against run 1's branch; Nsight Compute on both prefill cases
#   source .devdeps/env.sh && PART=final bash benchmarks/gpu_s23.sh   (1 x H200, the final tree, .ab-base.tar.gz =
#       main before the session: the mini-flashmla GPU tests, the runtime's core GPU tests and both parts of the rest;
#       bench_flashmla, bench_prefill; bench_decode on tree and base; the attention breakdown)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s23.sh   (1 x H200, tree = attn-lane-order, .ab-mid.tar.gz =
#       attn-producer: the mini-flashmla and the runtime's core GPU tests, bench_flashmla on both, bench_prefill,
#       Nsight Compute on the paged prefill)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s23
if [ -f .ab-mid.tar.gz ]; then
  mkdir -p /tmp/ab-mid && tar xzf .ab-mid.tar.gz -C /tmp/ab-mid
  MID_PYTHONPATH=/tmp/ab-mid/packages/mini-flashmla/src:$PYTHONPATH
fi
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  for side in new mid base; do
    pp=$PYTHONPATH; [ $side = base ] && pp=$BASE_PYTHONPATH; [ $side = mid ] && pp=$MID_PYTHONPATH
    run "flashmla_$side" 120 env PYTHONPATH="$pp" BENCH_PARTS=prefill,decode BENCH_JSON="flashmla_$side.json" \
      bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  run breakdown 150 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  ncu_profile sparse_prefill
  for side in new base; do
    pp=$PYTHONPATH; [ $side = base ] && pp=$BASE_PYTHONPATH
    run "prefill_$side" 120 env PYTHONPATH="$pp" python3 benchmarks/bench_prefill.py --out "$OUT/prefill_${side}_h200.json"
  done
  run moe_breakdown 150 bash -c "cd benchmarks && python3 exp_moe_breakdown.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  for side in new mid base; do echo "== flashmla $side"; grep -E "^\| (prefill|decode)" "$OUT/flashmla_$side.txt"; done
  tail -14 "$OUT/breakdown.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -30
  for side in new base; do echo "== prefill $side"; grep -E "tok/s|attention" "$OUT/prefill_$side.txt" | cut -c1-200 | head -6; done
  grep -E "^\| " "$OUT/moe_breakdown.txt"; tail -2 "$OUT/moe_breakdown.txt" | cut -c1-300
  ;;
r2)
  # tree = attn-producer with P through shared memory (commit D), mid = the branch's ids-staging commit (C, in
  # .ab-mid.tar.gz), base = main (.ab-base.tar.gz)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  for side in new mid base; do
    pp=$PYTHONPATH; [ $side = base ] && pp=$BASE_PYTHONPATH; [ $side = mid ] && pp=$MID_PYTHONPATH
    run "flashmla_$side" 120 env PYTHONPATH="$pp" BENCH_PARTS=prefill,decode BENCH_JSON="flashmla_$side.json" \
      bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  run breakdown 150 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  ncu_profile sparse_prefill sparse_prefill_bf16
  for side in new mid; do
    pp=$PYTHONPATH; [ $side = mid ] && pp=$MID_PYTHONPATH
    run "prefill_$side" 120 env PYTHONPATH="$pp" python3 benchmarks/bench_prefill.py --out "$OUT/prefill_${side}_h200.json"
  done
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  for side in new mid base; do echo "== flashmla $side"; grep -E "^\| (prefill|decode)" "$OUT/flashmla_$side.txt"; done
  tail -14 "$OUT/breakdown.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -40
  for side in new mid; do echo "== prefill $side"; grep -E "tok/s|attention" "$OUT/prefill_$side.txt" | cut -c1-200 | head -6; done
  ;;
final)
  # the final tree (attention producer: conflict-free dequantization, staged ids); baseline = main before the session
  run flashmla_tests 120 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run runtime_rest_a 90 $PYTEST $RUNTIME_REST_A -m "not multigpu" -n 16 --junitxml="$OUT/junit_rest_a.xml"
  run runtime_rest_b 130 $PYTEST runtime/tests integration_tests $RUNTIME_REST_B_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest_b.xml"
  run flashmla_new 60 env BENCH_PARTS=prefill,decode BENCH_JSON="flashmla_new.json" \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  run prefill_new 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  decode_bench decode_new env
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  run breakdown 40 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests runtime_rest_a runtime_rest_b
  grep -E "^\| (prefill|decode)" "$OUT/flashmla_new.txt"
  grep -E "tok/s|attention" "$OUT/prefill_new.txt" | cut -c1-200 | head -4
  for side in new base; do echo "== decode $side"; grep -E "graphs=1" "$OUT/decode_$side.txt" | cut -c1-200; done
  tail -14 "$OUT/breakdown.txt"
  ;;
r4)
  # tree = attn-lane-order (the dequantization's lanes along rows first); mid = attn-producer (.ab-mid.tar.gz)
  run flashmla_tests 120 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new mid; do
    pp=$PYTHONPATH; [ $side = mid ] && pp=$MID_PYTHONPATH
    run "flashmla_$side" 60 env PYTHONPATH="$pp" BENCH_PARTS=prefill,decode BENCH_JSON="flashmla_$side.json" \
      bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  run prefill_new 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_new_h200.json"
  ncu_profile sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  for side in new mid; do echo "== flashmla $side"; grep -E "^\| (prefill|decode)" "$OUT/flashmla_$side.txt"; done
  grep -E "tok/s|attention" "$OUT/prefill_new.txt" | cut -c1-200 | head -4
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -12
  grep -E "way bank" "$OUT/ncu/sparse_prefill_details.txt" | head -3
  ;;
esac
pack_out
