#!/usr/bin/env bash
# Session 28's GPU runs (docs/reports/gpu-session-2026-12-03-s28.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s28.sh   (1 x H200, tree = main with the V3 kernel's tail
#       split; .ab-base.tar.gz = 1bcb043: the mini-deepgemm GPU suite; exp_gemm_v3_tail.py; the runtime's core GPU
#       tests; bench_prefill on both sides; bench_v41_fold at 4,096 and 16,384 rows)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s28.sh   (1 x H200, tree = main with the tail split:
#       exp_gemm_v3_occupancy.py (the V3 kernel's tile and half-tile time on 132 .. 8 programs; 6 ring slots at
#       128 columns))
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s28.sh   (1 x H200, the same tree: exp_gemm_v3_clocks.py (SM
#       clock, power and throttle reasons under the V3 kernel on 132 and 66 programs and under cuBLAS))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s28.sh   (1 x H200, tree = main after the revert:
#       exp_power_clocks.py (SM clock and power under the dense V3 GEMM, the MoE prefill GEMM, their peers and
#       cuBLAS bf16))
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s28.sh   (1 x H200, tree = main after the review (the
#       _scaled_grouped_mm peer in one helper, scaled_grouped_mm_peer; exp_power_clocks.py's meta from
#       bench_flashmla.environment): exp_power_clocks.py and bench_fp4_e4m3_route.py)
# The V3 tail split was reverted after run 3 (docs/reports/deepgemm-gluon-v3.md, "Session 28"); the three experiments
# these parts run drive the split kernel and were removed with it: commit 210e881 has them.
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s28
case "${PART:-r1}" in
r1)
  run deepgemm_tests 160 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run v3_tail 130 bash -c "cd benchmarks && python3 exp_gemm_v3_tail.py"
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 60 new base
  run v41_fold 70 bash -c "cd benchmarks && python3 bench_v41_fold.py --rows 4096,16384"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  grep -vE '^\{' "$OUT/v3_tail.txt" | tail -24 | cut -c1-220
  show_sides new base
  grep -iE "geomean|gmean" "$OUT/v41_fold.txt" | cut -c1-220
  ;;
r2)
  run v3_occupancy 200 bash -c "cd benchmarks && python3 exp_gemm_v3_occupancy.py"
  cat "$OUT/summary.txt"
  grep -vE '^\{' "$OUT/v3_occupancy.txt" | tail -26 | cut -c1-200
  ;;
r3)
  run v3_clocks 100 bash -c "cd benchmarks && python3 exp_gemm_v3_clocks.py"
  cat "$OUT/summary.txt"
  tail -6 "$OUT/v3_clocks.txt" | cut -c1-250
  ;;
r4|r5)
  [ "$PART" = r5 ] && run route 120 env OUT="$OUT/route" bash -c "mkdir -p \$OUT && cd benchmarks && python3 bench_fp4_e4m3_route.py"
  run power_clocks 120 bash -c "cd benchmarks && python3 exp_power_clocks.py"
  cat "$OUT/summary.txt"
  tail -7 "$OUT/power_clocks.txt" | cut -c1-250
  [ "$PART" = r5 ] && grep -E "^\| " "$OUT/route.txt" | cut -c1-200
  ;;
esac
pack_out
