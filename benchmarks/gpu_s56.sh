#!/usr/bin/env bash
# Session 56's GPU runs (docs/reports/gpu-session-2026-12-05-s56.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && DEADLINE=560 PART=r1 bash benchmarks/gpu_s56.sh   (1 GPU; tree = main 13c3ba6,
#       .ab-base.tar.gz = main 2459deb, before session 55's window-row decode): on an H200 the figures owed since
#       sessions 53-55 (bench_flashmla on both sides, exp_moe_masked_tiles with session 53's side stream,
#       exp_moe_contiguous_swapab with session 54's route); on an H100 the paged prefill kernel's Nsight Compute
#       profile (where the producer's time goes after session 55)
#   PART=r2 (tree = the attention producer's conversions with fewer ALU instructions: FP4 rows 10 per word instead of
#       13, window rows' shifts as multiplies; .ab-mid.tar.gz = 3fda408, the FP4 rows' change alone; .ab-base.tar.gz
#       = main 13c3ba6): mini-flashmla's GPU suite (with the new every-e2m1-pair test), the outputs' hash on the three
#       sides (the same bits), bench_flashmla on the three sides, the runtime's core GPU tests, bench_prefill on the
#       tree and the base
#   PART=r3 (tree = the MoE converter's selector shift as a high multiply, IMAD.HI on the FMA pipe; .ab-base.tar.gz =
#       main bd5a617): the FP8-MMA MoE kernels' tests, bench_fp4_e4m3_route and exp_moe_masked_tiles on both sides,
#       the runtime's core GPU tests
#   PART=r4 (tree = CONTIGUOUS_SWAPAB_MAX_ROWS 32 -> 48, after run 1's H200 figures at ~48 rows; .ab-base.tar.gz =
#       main 194e603): the FP8-MMA MoE kernels' tests, the runtime's core GPU tests, bench_prefill at 3,072 tokens
#       (~48 rows per expert on one GPU's 384 experts) on both sides
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
r2)  # DEADLINE=570
  flashmla_tests 150
  hash_sides new mid base
  fits 250 && flashmla_sides 100 new mid base
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  if grep -q H200 "$OUT/env.txt"; then fits 200 && prefill_sides 95 new base
  else  # seven sample layers do not fit an H100's 80 GB
    for side in new base; do
      fits 100 && run "prefill_$side" 95 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        --tokens 4096 --layers window,r1-full,r1-reuse --out "$OUT/prefill_${side}_h100.json"
    done
  fi
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "sha256" "$OUT"/hash_*.txt; show_sides new mid base
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r3)  # DEADLINE=560
  fp4_e4m3_tests 90
  route_sides 110 new base
  fits 230 && script_sides 100 exp_moe_masked_tiles.py tiles new base
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  for side in new base; do
    echo "== $side"; grep -hE "^\|" "$OUT/route_$side.txt" | cut -c1-230
    grep -hE "^\|" "$OUT/tiles_$side.txt" 2>/dev/null
  done
  ;;
r4)  # DEADLINE=230 (the session's device time left)
  fp4_e4m3_tests 60
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  layers=""; grep -q H200 "$OUT/env.txt" || layers="--layers window,r1-full,r1-reuse"
  for side in new base; do
    fits 40 && run "prefill_$side" 45 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      --tokens 3072 $layers --out "$OUT/prefill_${side}.json"
  done
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests; show_sides new base
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200; grep -h "moe experts" "$OUT"/prefill_*.txt
  ;;
esac
pack_out
