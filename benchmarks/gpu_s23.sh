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
#       bench_flashmla, bench_prefill; bench_decode on tree and base; the attention breakdown; run 3)
#       Outcome: every test passed (84 + 109 + 59 + 162; 1 + 8 + 1 + 1 skipped); paged / bf16 prefill 271.3 / 340.2
#       TFLOP/s; prefill step 585.6 ms; medium decode 10.74 / 14.47 ms against main's 10.71 / 14.43
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s23.sh   (1 x H200, tree = attn-lane-order, .ab-mid.tar.gz =
#       attn-producer: the mini-flashmla and the runtime's core GPU tests, bench_flashmla on both, bench_prefill,
#       Nsight Compute on the paged prefill)
#       Outcome: tests passed (84, 109); the lane order 1.00x, every dequantization access conflict-free (kept)
#   source .devdeps/env.sh && PART=rest bash benchmarks/gpu_s23.sh   (1 x H200, main's final tree: parts A and B of the
#       rest of the runtime's GPU suite, which run 3 ran before the lane-order commit)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s23
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 120 new mid base
  run breakdown 150 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  ncu_profile sparse_prefill
  prefill_sides 120 new base
  run moe_breakdown 150 bash -c "cd benchmarks && python3 exp_moe_breakdown.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new mid base
  tail -14 "$OUT/breakdown.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -30
  grep -E "^\| " "$OUT/moe_breakdown.txt"; tail -2 "$OUT/moe_breakdown.txt" | cut -c1-300
  ;;
r2)
  # tree = attn-producer with P through shared memory (commit D), mid = the branch's ids-staging commit (C, in
  # .ab-mid.tar.gz), base = main (.ab-base.tar.gz)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 120 new mid base
  run breakdown 150 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  ncu_profile sparse_prefill sparse_prefill_bf16
  prefill_sides 120 new mid
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new mid base
  tail -14 "$OUT/breakdown.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -40
  ;;
final)
  # the final tree (attention producer: conflict-free dequantization, staged ids); baseline = main before the session
  run flashmla_tests 120 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  rest_ab
  flashmla_sides 60 new
  prefill_sides 60 new
  decode_bench decode_new env
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  run breakdown 40 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests runtime_rest_a runtime_rest_b
  show_sides new
  for side in new base; do echo "== decode $side"; grep -E "graphs=1" "$OUT/decode_$side.txt" | cut -c1-200; done
  tail -14 "$OUT/breakdown.txt"
  ;;
r4)
  # tree = attn-lane-order (the dequantization's lanes along rows first); mid = attn-producer (.ab-mid.tar.gz)
  run flashmla_tests 120 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  flashmla_sides 60 new mid
  prefill_sides 60 new
  ncu_profile sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new mid
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -12
  grep -E "way bank" "$OUT/ncu/sparse_prefill_details.txt" | head -3
  ;;
rest)
  # the final tree: parts A and B of the rest of the runtime's GPU suite (run 3 ran them before the lane order)
  rest_ab
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  ;;
esac
pack_out
