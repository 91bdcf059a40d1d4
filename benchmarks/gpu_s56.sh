#!/usr/bin/env bash
# Session 56's GPU runs (docs/reports/gpu-session-2026-12-05-s56.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && DEADLINE=560 PART=r1 bash benchmarks/gpu_s56.sh   (1 GPU; tree = main 13c3ba6,
#       .ab-base.tar.gz = main 2459deb, before session 55's window-row decode): on an H200 the figures owed since
#       sessions 53-55 (bench_flashmla on both sides, exp_moe_masked_tiles with session 53's side stream,
#       exp_moe_contiguous_swapab with session 54's route); on an H100 the paged prefill kernel's Nsight Compute
#       profile (where the producer's time goes after session 55)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s56
case "${PART:-r1}" in
r1)
  if grep -q H200 "$OUT/env.txt"; then
    flashmla_sides 110 new base
    fits 110 && script_sides 100 exp_moe_masked_tiles.py tiles new
    fits 210 && script_sides 200 exp_moe_contiguous_swapab.py contig new
  else
    ncu_profile sparse_prefill
    fits 110 && flashmla_sides 100 new
  fi
  cat "$OUT/summary.txt"; show_sides new base
  [ -f "$OUT/tiles_new.txt" ] && grep -hE "^\||^split" "$OUT/tiles_new.txt"
  [ -f "$OUT/contig_new.txt" ] && grep -hE "^\|" "$OUT/contig_new.txt"
  ;;
esac
pack_out
