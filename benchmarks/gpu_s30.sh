#!/usr/bin/env bash
# Session 30's GPU runs (docs/reports/gpu-session-2026-12-03-s30.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s30.sh   (1 x H200, tree = main with the contiguous
#       FP8-MMA MoE kernel's second warpgroup skipping all-padding halves (7890bbc); .ab-base.tar.gz = cce154a: the
#       mini-deepgemm and mini-flashmla GPU suites; the runtime's core GPU tests; bench_prefill and
#       bench_fp4_e4m3_route on both sides)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s30.sh   (1 x H200, tree = main with RMSNorm as one Triton
#       kernel; .ab-base.tar.gz = 7890bbc (run 1's tree) plus layers/rmsnorm.py, unused there (prefill_stages.py
#       imports it), .ab-mid.tar.gz = cce154a (no padding-half skip): the
#       rmsnorm and hyper-connection GPU tests, the runtime's core GPU tests;
#       bench_rmsnorm.py; bench_prefill and bench_decode against base; bench_fp4_e4m3_route (384 experts of ~64
#       rows added) against mid)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s30.sh   (1 x H200, tree = main with the folded masked
#       kernel's two-warpgroup tile (not routed): the mini-deepgemm GPU suite; exp_moe_masked_tiles.py)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s30.sh   (1 x H200, tree = main with exp_norm_host.py: the
#       fused RMSNorm's host cost per call, and eager decode with the norms counted, fused and forced onto torch)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s30.sh   (1 x H200, the final source tree: the rest of the
#       runtime's GPU suite, parts A and B in one pytest run, within the session's last device time)
# Parts r3 and r4 no longer run on main as it stands: the two-warpgroup tile was reverted after run 3 (commit ddce3e4
# has it) and exp_norm_host.py removed after run 4 (commit 454f83c has it).
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s30
case "${PART:-r1}" in
r1)
  run deepgemm_tests 140 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run flashmla_tests 90 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 45 new base
  route_sides 50 new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests flashmla_tests runtime_tests
  show_sides new base
  grep -E "^(moe experts) " "$OUT/prefill_new.txt" "$OUT/prefill_base.txt"
  grep -E "^\| " "$OUT/route_new.txt" "$OUT/route_base.txt" | cut -c1-200 | head -24
  ;;
r2)
  run norm_tests 100 $PYTEST -n 8 runtime/tests/test_rmsnorm.py runtime/tests/test_hyper_connections.py -m gpu
  run runtime_tests 90 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run bench_rmsnorm 60 python3 benchmarks/bench_rmsnorm.py --out "$OUT/bench_rmsnorm.json"
  prefill_sides 45 new base
  route_sides 70 new mid
  decode_bench decode_new
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  cat "$OUT/summary.txt"; test_summary norm_tests runtime_tests
  grep -E "^\| " "$OUT/bench_rmsnorm.txt"
  show_sides new base
  grep -E "^(norm|moe experts) " "$OUT/prefill_new.txt" "$OUT/prefill_base.txt"
  grep -E "^\| contiguous" "$OUT/route_new.txt" "$OUT/route_mid.txt" | cut -c1-200
  grep -hE "ms/step|tok/s" "$OUT/decode_new.txt" "$OUT/decode_base.txt" | head -16 | cut -c1-200
  ;;
r3)
  run deepgemm_tests 150 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run masked_tiles 150 bash -c "cd benchmarks && python3 exp_moe_masked_tiles.py"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests
  grep -E "^\| " "$OUT/masked_tiles.txt" | cut -c1-250
  ;;
r4)
  run norm_per_call 60 bash -c "cd benchmarks && python3 exp_norm_host.py --per-call"
  run norm_decode_fused 120 bash -c "cd benchmarks && python3 exp_norm_host.py"
  run norm_decode_torch 120 bash -c "cd benchmarks && python3 exp_norm_host.py --torch"
  cat "$OUT/summary.txt"
  grep -hE "^(T=|fused|torch)|Error" "$OUT"/norm_*.txt | cut -c1-300
  ;;
r5)
  run runtime_rest 125 $PYTEST runtime/tests integration_tests $RUNTIME_CORE_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest.xml"
  cat "$OUT/summary.txt"; test_summary runtime_rest
  ;;
esac
pack_out
