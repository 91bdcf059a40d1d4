#!/usr/bin/env bash
# Session 55's GPU runs (docs/reports/gpu-session-2026-12-05-s55.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s55.sh   (1 GPU; tree = main + the attention's FP8 window
#       rows decoded by integer placement instead of the e4m3 -> f16 -> bf16 conversions; .ab-base.tar.gz = main
#       2459deb): mini-flashmla's GPU suite (with the new every-code test), the outputs' hash on both sides (the same
#       bits), bench_flashmla on both sides (prefill and decode), exp_alu_rates (the conversions' issue rates), the
#       runtime's core GPU tests (the engine's attention takes the paged kernel)
#   PART=r2 (same tree and base): bench_prefill at 4,096 tokens on three sample layers (the seven of the default do not
#       fit an H100's 80 GB) on both sides; the rest of the runtime suite (parts A and B; session 54's was cut short)
#   PART=r3 (same tree): exp_moe_contiguous_swapab.py with its ~48-rows-per-expert case (session 54's threshold)
#   PART=r4 (the review's mend: the packed-weight descriptors built per launch through _tma_desc; offline the same
#       SASS for all 185 mini-deepgemm and runtime launches): the FP8-MMA MoE kernels' tests, the runtime's core GPU
#       tests; on an H200 also the owed H200 figures: exp_moe_masked_tiles (the masked target at ~32 rows with
#       session 53's side stream) and bench_flashmla on both sides (.ab-base.tar.gz = main 2459deb)
#   PART=r5 (after r4's fix): the rest of the runtime suite (run as one command line with DEADLINE=330)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s55
case "${PART:-r1}" in
r1)
  flashmla_tests 150
  hash_sides new base
  fits 240 && flashmla_sides 110 new base
  fits 100 && run exp_alu 60 bash -c "cd benchmarks && OUT=$OUT python3 exp_alu_rates.py"
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -h "sha256" "$OUT"/hash_*.txt; show_sides new base
  grep -hE "^\| (F2F|FFMA|LOP3 \(|PRMT, imm|SHF|HMUL2 \(|IMAD \()" "$OUT/exp_alu.txt"
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  ;;
r2)  # run as one command line with DEADLINE=560 (the device's idle release left no time to commit this part first)
  for side in new base; do
    run "prefill_$side" 130 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py --tokens 4096 \
      --layers window,r1-full,r1-reuse --out "$OUT/prefill_${side}_h100.json"
  done
  fits 100 && rest_ab 80 180
  cat "$OUT/summary.txt"; show_sides new base; grep -h "sparse attention" "$OUT"/prefill_*.txt
  test_summary runtime_rest_a runtime_rest_b; grep -h "^FAILED\|^ERROR" "$OUT"/runtime_rest_*.txt | cut -c1-200
  ;;
r3)  # run as one command line with DEADLINE=300
  script_sides 200 exp_moe_contiguous_swapab.py contig new
  cat "$OUT/summary.txt"; grep -hE "^\|" "$OUT/contig_new.txt"; grep -h "failed\|Error" "$OUT/contig_new.txt" | head -5
  ;;
r4)
  fp4_e4m3_tests 90
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  if grep -q H200 "$OUT/env.txt"; then
    fits 110 && script_sides 100 exp_moe_masked_tiles.py tiles new
    fits 200 && flashmla_sides 100 new base
  fi
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*_tests.txt | cut -c1-200
  [ -f "$OUT/tiles_new.txt" ] && grep -hE "^\||^split" "$OUT/tiles_new.txt"
  show_sides new base
  ;;
r5)
  rest_ab 80 200
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  grep -h "^FAILED\|^ERROR" "$OUT"/runtime_rest_*.txt | cut -c1-200
  ;;
esac
pack_out
