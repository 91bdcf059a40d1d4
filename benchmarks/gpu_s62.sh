#!/usr/bin/env bash
# Session 62's GPU runs.
#   run 1 (an H100; gpu_s61.sh PART=late): the merge's PDL trigger at the end of the attention's block loop (dc21ace)
#       against main (4b75e81) and the trigger at the kernel's start (dc9d46b), the tree's Gluon tests, the producer
#       sleeping 0-700 ns after finding tile 0 free (exp_flashmla_yield.py).
#   run 2 (PART=ab): the tree = the split decode's partials in bf16, written through the warpgroup's columns of tile 0
#       (the unsplit epilogue's staging, one helper for both); .ab-alt.tar.gz = the same partials straight from the
#       MMA's layout; .ab-base.tar.gz = main (fp32 partials); .ab-mid.tar.gz = main + the quantized producer's copy
#       addresses as one IMAD.WIDE per row and operand (a073965, reverted by f8b4413). The decode part on tree, base
#       and alt; the attention outputs' hash on base and mid (the producer change keeps every bit), the prefill part
#       in two rounds on base and mid, mini-flashmla's Gluon tests on mid, mini-flashmla's GPU suite on the tree.
#   run 3 (PART=checks): the runtime's core GPU tests on the tree, the decode part again (tree, base), bench_decode's
#       medium model on tree and base, on an H200 the owed test_gemm_fp4_e4m3.py.
#   run 4 (PART=h200; stops at once on another card): the decode part on tree and base, mini-flashmla's GPU suite, the
#       owed test_gemm_fp4_e4m3.py and test_cuda_decode.py (H100s only since session 59). It ran on an H200 with the
#       session's last 287 s: the last two did not fit (test_cuda_decode.py ran none in its 60 s).
#   PART=owed_h200 (for the next session; stops at once on another card): what an H200 still owes, with limits that
#       fit an H200 (run 4: mini-flashmla's suite needs ~100 s at -n 8): test_gemm_fp4_e4m3.py, the runtime's core
#       GPU tests (test_cuda_decode.py among them) on the bf16 partials, mini-flashmla's suite (~400 s).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz", ".ab-mid.tar.gz"]; source .devdeps/env.sh && DEADLINE=N
# PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s62
case "${PART:-ab}" in
ab)
  decode_parts 60 new base alt
  hash_sides base mid
  prefill_part_rounds 2 base mid
  fits 60 && run gluon_tests_mid 50 env PYTHONPATH="$MID_PYTHONPATH" $PYTEST -n 16 \
    packages/mini-flashmla/tests/test_kernels.py -k gluon --junitxml="$OUT/junit_gluon_mid.xml"
  fits 100 && flashmla_tests 90
  test_summary gluon_tests_mid flashmla_tests
  cat "$OUT"/hash_*.txt
  grep -H "^| prefill" "$OUT"/prefill_part_*.txt | cut -c1-170
  ;;
checks)
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  test_summary runtime_tests
  ROUND=2 decode_parts 60 new base
  if [ "$CARD" = h200 ]; then  # owed on an H200 since session 59 (H100s only so far)
    fits 130 && fp4_e4m3_tests 120
    test_summary fp4_e4m3_tests
  fi
  fits 130 && decode_bench decode_e2e_new
  fits 130 && decode_bench decode_e2e_base env PYTHONPATH="$BASE_PYTHONPATH"
  grep -hE "tok/s|attention" "$OUT"/decode_e2e_*.txt 2>/dev/null | cut -c1-200 | head -8
  ;;
h200)
  [ "$CARD" = h200 ] || { echo "not an H200 ($CARD): nothing run"; exit 0; }
  decode_parts 60 new base
  fits 100 && flashmla_tests 90
  fits 130 && fp4_e4m3_tests 120
  fits 70 && run cuda_decode_tests 60 $PYTEST -n 8 runtime/tests/test_cuda_decode.py \
    --junitxml="$OUT/junit_cuda_decode.xml"
  test_summary flashmla_tests fp4_e4m3_tests cuda_decode_tests
  ;;
owed_h200)
  [ "$CARD" = h200 ] || { echo "not an H200 ($CARD): nothing run"; exit 0; }
  fits 130 && fp4_e4m3_tests 120
  fits 160 && run runtime_tests 150 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 130 && flashmla_tests 120
  test_summary fp4_e4m3_tests runtime_tests flashmla_tests
  ;;
esac
cat "$OUT/summary.txt"
grep -H "^| decode batch [0-9]* \(graph\|, Gluon\)" "$OUT"/decode_part_*.txt 2>/dev/null | cut -c1-170
pack_out
