#!/usr/bin/env bash
# Session 54's GPU runs (docs/reports/gpu-session-2026-12-05-s54.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s54.sh   (1 GPU; tree = main 0a81288: session 53's
#       two-step ring slots and a split's wide launch on a side stream; .ab-base.tar.gz = main 86d4e0a, before both):
#       the FP8-MMA MoE kernels' tests; the runtime's core GPU tests; exp_moe_masked_tiles; the decode A/B (seven
#       layers at 24 GB of KV cache where the card has an H200's memory, else bench_decode's default layers at 8 GB)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s54
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 90
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  fits 100 && script_sides 100 exp_moe_masked_tiles.py tiles new
  if grep -q H200 "$OUT/env.txt"; then
    fits 200 && decode_all_sides new base
  else
    fits 120 && decode_bench decode_new env PYTHONPATH="$(side_path new)"
    fits 120 && decode_bench decode_base env PYTHONPATH="$(side_path base)"
  fi
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  grep -hE "^\||^split" "$OUT/tiles_new.txt"
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r2)  # tree = main + the contiguous layout on the swap-AB kernel up to 64 rows per expert
  # (gemm.CONTIGUOUS_SWAPAB_MAX_ROWS); .ab-base.tar.gz = main 0a81288 (the contiguous kernel only): the kernels'
  # tests (with the new bitwise test), the experiment (the contiguous kernel against the swap-AB kernel's tiles,
  # ~16-256 rows per expert), the runtime's core GPU tests (the engine's prefill takes the new route), bench_prefill
  # on both sides (one GPU: ~64 rows)
  fp4_e4m3_tests 90
  fits 150 && script_sides 150 exp_moe_contiguous_swapab.py contig new
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 100 && prefill_sides 100 new base
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -hE "^\|" "$OUT/contig_new.txt"; grep -h "failed" "$OUT/contig_new.txt" | head -3
  show_sides new base
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r3)  # tree = r2's with the swap-AB kernel up to 32 rows per expert (r2's experiment: 1.11-1.27x at ~16-32, 0.85-0.91x
  # at ~64); bench_prefill at 2,048 tokens (one GPU: ~32 rows per expert) on three sample layers (the seven of the
  # default ran out of the H100's 80 GB in r2), on the tree and on base (main 0a81288)
  for side in new base; do
    run "prefill_$side" 150 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py --tokens 2048 \
      --layers window,r1-full,r1-reuse --out "$OUT/prefill_${side}_h100.json"
  done
  cat "$OUT/summary.txt"; show_sides new base
  grep -hE "moe experts" "$OUT/prefill_new.txt" "$OUT/prefill_base.txt" | head -6
  ;;
r4)  # tree = r3's + the contiguous kernel's 64 x 256 tiles as an experiment (gemm.CONTIGUOUS_64_ROW_MAX_ROWS, off):
  # the kernels' tests (64 x 256 tiles bitwise the 128 x 128 ones), the experiment with its new variant
  fp4_e4m3_tests 90
  fits 170 && script_sides 170 exp_moe_contiguous_swapab.py contig new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests
  grep -hE "^\|" "$OUT/contig_new.txt"; grep -h "failed\|Error" "$OUT/contig_new.txt" | head -5
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r5)  # the final tree (r4's experiment reverted: the contiguous kernel's SASS is main's again, offline): the kernels'
  # tests, the runtime's core GPU tests, bench_prefill at 1,024 tokens (one GPU: ~16 rows per expert) on both sides
  fp4_e4m3_tests 90
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new base; do
    fits 90 && run "prefill_$side" 90 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      --tokens 1024 --layers window,r1-full,r1-reuse --out "$OUT/prefill_${side}_h100.json"
  done
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests; show_sides new base
  grep -hE "moe experts" "$OUT/prefill_new.txt" "$OUT/prefill_base.txt" | head -4
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r6)  # the final tree's rest of the runtime suite (parts A and B; the engine's small models take the swap-AB
  # contiguous route), in what is left of the session's device time: DEADLINE=220
  fits 60 && rest_ab 80 130
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  grep -h "^FAILED\|^ERROR" "$OUT"/runtime_rest_*.txt | cut -c1-200
  ;;
esac
pack_out
