#!/usr/bin/env bash
# Session 64's GPU runs.
#   PART=turns (any card): the dense V3 kernel's two math warpgroups issuing their MMAs in turns (GLUON_TURNS), its
#       tests (test_gemm_gluon_fp8.py, with the turns variants), exp_gemm_gluon_v3.py at M = 4,096 and 16,384 (each
#       shipped tile with and without turns, against cuBLAS in the same process), mini-flashmla's suite and the
#       runtime's core GPU tests (session 63's final forms of the attention kernels' 64-bit offsets and the NaN
#       test, never run on a GPU), then Nsight Compute on wo_b with and without turns (exp_gemm_gluon_v3:profile_call).
#   PART=pairs (any card): the dense V3 kernel's 128-column tiles with K steps in pairs, the second MMA in flight
#       while the first is promoted (GLUON_PAIRS), its tests, exp_gemm_gluon_v3.py at M = 4,096 and 16,384, Nsight
#       Compute on wo_b for 128-column tiles without and with pairs (VARIANTS 0 and 1).
#   PART=final (any card; the tree with the pairs routed, scales loaded a pair ahead): mini-deepgemm's dense tests
#       (test_gemm_gluon_fp8.py, test_gemm.py), the runtime's core GPU tests, exp_gemm_gluon_v3.py at both M (128
#       columns one step at a time and in pairs, 256 columns with one and two store buffers: the route before and
#       after in one process), bench_prefill on .ab-base.tar.gz (main before the pairs, 5ba2eb6) and the tree.
#   PART=moe (any card): the FP8-MMA contiguous MoE kernel's 128-row tiles with K steps in pairs (.ab-base.tar.gz =
#       8cd8ace, before them): test_gemm_fp4_e4m3.py, bench_prefill on both sides (one GPU's ~64 rows per expert),
#       exp_moe_contiguous_swapab.py at 384 experts of ~48 / ~64 / ~96 rows on both sides, the runtime's core tests.
# carry [".devdeps"] (PART=final, moe: also ".ab-base.tar.gz"); source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s64
case "${PART:-turns}" in
turns)
  run v3_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py --junitxml="$OUT/junit_v3.xml"
  fits 200 && script_sides 200 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  fits 130 && flashmla_tests 120
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 150 && NCU_SECS=70 ncu_profile exp_gemm_gluon_v3:profile_call:0 exp_gemm_gluon_v3:profile_call:1
  test_summary v3_tests flashmla_tests runtime_tests
  grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  ;;
pairs)
  run v3_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py --junitxml="$OUT/junit_v3.xml"
  fits 200 && script_sides 200 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  fits 60 && NCU_SECS=70 ncu_profile exp_gemm_gluon_v3:profile_call:0 exp_gemm_gluon_v3:profile_call:1
  test_summary v3_tests
  grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  ;;
final)
  run dense_tests 100 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
    packages/mini-deepgemm/tests/test_gemm.py --junitxml="$OUT/junit_dense.xml"
  fits 130 && run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  fits 170 && script_sides 160 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  fits 120 && prefill_sides 110 base new
  test_summary dense_tests runtime_tests
  grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  grep -hE "tok/s|projections" "$OUT"/prefill_*.txt | cut -c1-160
  ;;
moe)
  fp4_e4m3_tests 150
  PREFILL_LAYER_ARGS=(--tokens 4096 --layers window,r1-full,r1-reuse)  # runs 1-3's three layers on any card
  fits 120 && prefill_sides 110 base new
  fits 140 && script_sides 65 "exp_moe_contiguous_swapab.py --cases 384x48 384x64 384x96 --variants contiguous_kernel \
    swapab" moe_exp base new
  fits 110 && run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  test_summary fp4_e4m3_tests runtime_tests
  grep -hE "tok/s|moe experts" "$OUT"/prefill_*.txt | cut -c1-160
  grep -hE "^\| 384" "$OUT"/moe_exp_*.txt
  ;;
esac
cat "$OUT/summary.txt"
pack_out
