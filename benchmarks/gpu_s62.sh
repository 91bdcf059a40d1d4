#!/usr/bin/env bash
# Session 62's GPU runs.
#   run 1 (an H100; gpu_s61.sh PART=late): the merge's PDL trigger at the end of the attention's block loop (dc21ace)
#       against main (4b75e81) and the trigger at the kernel's start (dc9d46b), the tree's Gluon tests, the producer
#       sleeping 0-700 ns after finding tile 0 free (exp_flashmla_yield.py).
#   run 2: the split decode's partials in bf16. The tree writes them through its columns of tile 0 (the unsplit
#       epilogue's staging, one helper for both); .ab-alt.tar.gz writes them straight from the MMA's layout;
#       .ab-base.tar.gz = main (fp32 partials). The decode part on tree, base and alt, then mini-flashmla's GPU
#       tests and the runtime's core GPU tests on the tree, a second round of the decode part (tree, base), the
#       medium model's bench_decode on tree and base, and on an H200 the owed tests (test_gemm_fp4_e4m3.py).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz"]; source .devdeps/env.sh && DEADLINE=N bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s62
decode_parts 60 new base alt
fits 100 && flashmla_tests 90
fits 120 && run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
  --junitxml="$OUT/junit_runtime.xml"
test_summary flashmla_tests runtime_tests
ROUND=2 decode_parts 60 new base
if [ "$CARD" = h200 ]; then  # owed on an H200 since session 59 (H100s only so far)
  fits 130 && fp4_e4m3_tests 120
  test_summary fp4_e4m3_tests
fi
fits 130 && decode_bench decode_e2e_new
fits 130 && decode_bench decode_e2e_base env PYTHONPATH="$BASE_PYTHONPATH"
cat "$OUT/summary.txt"
grep -H "^| decode batch [0-9]* \(graph\|, Gluon\)" "$OUT"/decode_part_*.txt 2>/dev/null | cut -c1-170
grep -hE "tok/s|attention" "$OUT"/decode_e2e_*.txt 2>/dev/null | cut -c1-200 | head -8
pack_out
