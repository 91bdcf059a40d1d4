#!/usr/bin/env bash
# Session 25's GPU runs (docs/reports/gpu-session-2026-12-02-s25.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s25.sh   (1 x H200, tree = main with the attention kernel's
#       register-pipelined quantized producer and the overflow-proof flip index, .ab-base.tar.gz = main before the
#       session: the mini-flashmla GPU tests; bench_flashmla and bench_prefill on both; the attention breakdown on the
#       tree; exp_moe_masked_rega.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s25
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 60 new base
  run breakdown 70 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  run rega 100 bash -c "cd benchmarks && python3 exp_moe_masked_rega.py"
  prefill_sides 70 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new base
  tail -14 "$OUT/breakdown.txt"
  tail -12 "$OUT/rega.txt" | cut -c1-250
  ;;
esac
pack_out
