#!/usr/bin/env bash
# Session 44's GPU runs (docs/reports/gpu-session-2026-12-04-s44.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s44.sh   (1 x H200; tree = main + _masked_tile's register
#       cap): the FP8-MMA MoE kernels' tests; exp_moe_masked_tiles (8- and 16-token tiles, register caps 128 / 96 /
#       80, at 384 experts of ~1 / 2 / 4 rows and 96 of ~8)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s44
case "${PART:-r1}" in
r1)
  run fp4_e4m3_tests 120 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py \
    --junitxml="$OUT/junit_fp4_e4m3.xml"
  script_sides 240 exp_moe_masked_tiles.py tiles new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests
  grep -E "^\|" "$OUT/tiles_new.txt"; grep -m3 -E "Error|error" "$OUT/tiles_new.txt" | cut -c1-300
  ;;
esac
pack_out
