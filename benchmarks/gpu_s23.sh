#!/usr/bin/env bash
# Session 23's GPU runs (docs/reports/gpu-session-2026-12-02-s23.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s23.sh   (1 x H200, tree = branch attn-producer, baseline =
#       main's src folders in .ab-base.tar.gz, the branch's first commit (conflict-free dequantization stores only) in
#       .ab-mid.tar.gz: the mini-flashmla GPU tests; bench_flashmla (prefill, decode) on the three; the attention
#       breakdown and Nsight Compute on the paged prefill, branch; bench_prefill on branch and main; exp_moe_breakdown)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s23.sh   (1 x H200, tree = attn-producer + P through shared
#       memory, .ab-mid.tar.gz = the ids-staging commit, .ab-base.tar.gz = main: the mini-flashmla GPU tests,
#       bench_flashmla on the three, the breakdown, Nsight Compute on both prefill cases, bench_prefill on tree and mid)
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
esac
pack_out
