#!/usr/bin/env bash
# Session 63's GPU runs.
#   PART=ab (any card): .ab-base.tar.gz = main before the session (8c416af); .ab-mid.tar.gz = b0695b0, the attention
#       kernels' 64-bit query offsets; the tree = mid + the owner's softmax scaling the row max (one FFMA per
#       exponent). The attention outputs' hash on base and mid (the offsets keep every bit), mini-flashmla's kernel
#       tests on the tree (the new s_q = 65,544 case among them), bench_flashmla's prefill part in two rounds and its
#       decode part on all three sides.
#   PART=v3 (any card): the dense V3 kernel with a second store buffer per math warpgroup for 256-column tiles (3
#       stages), its tests (test_gemm_gluon_fp8.py) and exp_gemm_gluon_v3.py at M = 4,096 and 16,384: 4 stages and one
#       buffer (shipped), 3 and one, 3 and two, against cuBLAS in the same process.
#   PART=v3b (any card): the same with the two buffers routed for 256-column tiles (.ab-base.tar.gz = dc20441,
#       before the V3 change): the V3 tests, exp_gemm_gluon_v3.py again, bench_prefill on base and tree.
#   PART=final (any card; the final tree): the V3 kernel's and mini-deepgemm's dense tests (test_gemm_gluon_fp8.py,
#       test_gemm.py), the runtime's core GPU tests, mini-flashmla's suite (the empty slots' masked bf16 copy and its
#       NaN test among them), bench_flashmla's prefill part in two rounds against .ab-base.tar.gz (the commit before
#       the masked copy); on an H200 also test_gemm_fp4_e4m3.py (with the core tests, what session 62 left owed).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s63
case "${PART:-ab}" in
ab)
  hash_sides base mid
  fits 130 && run kernel_tests 120 $PYTEST -n 8 packages/mini-flashmla/tests/test_kernels.py \
    --junitxml="$OUT/junit_kernels.xml"
  prefill_part_rounds 2 base mid new
  decode_parts 50 base mid new
  test_summary kernel_tests
  cat "$OUT"/hash_*.txt
  grep -H "^| prefill" "$OUT"/prefill_part_*.txt | cut -c1-170
  ;;
v3)
  run v3_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py --junitxml="$OUT/junit_v3.xml"
  fits 200 && script_sides 300 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  test_summary v3_tests
  grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  ;;
v3b)
  run v3_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py --junitxml="$OUT/junit_v3.xml"
  fits 200 && script_sides 200 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  fits 120 && prefill_sides 110 base new
  test_summary v3_tests
  grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  grep -hE "tok/s|projections" "$OUT"/prefill_*.txt | cut -c1-160
  ;;
final)
  run dense_tests 80 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
    packages/mini-deepgemm/tests/test_gemm.py --junitxml="$OUT/junit_dense.xml"
  fits 160 && run runtime_tests 150 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 130 && flashmla_tests 120
  prefill_part_rounds 2 base new
  [ "$CARD" = h200 ] && fits 130 && fp4_e4m3_tests 120
  test_summary dense_tests runtime_tests flashmla_tests fp4_e4m3_tests
  grep -H "^| prefill" "$OUT"/prefill_part_*.txt | cut -c1-170
  ;;
esac
cat "$OUT/summary.txt"
grep -H "^| decode batch [0-9]* \(graph\|, Gluon\)" "$OUT"/decode_part_*.txt 2>/dev/null | cut -c1-170
pack_out
