#!/usr/bin/env bash
# Session 71's GPU runs.
#   PART=moe (~480 s): the contiguous FP8 x FP4 kernel on folded activations, three sides: base (main 04d2411,
#       .ab-base.tar.gz), mid (94d59de, .ab-mid.tar.gz: each K step's MMAs as two m64n64 halves, the lo half promoted
#       under the hi half's MMA) and new (the tree: mid + 256-row tiles fed by one feeder warpgroup, the packed weights
#       5 steps ahead). test_gemm_fp4_e4m3.py on the tree; exp_moe_contiguous_swapab.py (the contiguous kernel, and
#       the swap-AB kernel beside it for a bitwise check against an unchanged kernel) on 128-row cases (384 experts of
#       ~64 / ~96) and 256-row ones (192 of ~128, 96 of ~256); bench_fp4_e4m3_route.py (96 experts of 128-1,024 rows
#       and the peer) on each side; the runtime's core GPU tests on the tree.
#   PART=h200 (~480 s): on an H200, the owed H200 figures. Sessions 67-68's attention
#       (mid = .ab-mid.tar.gz of d8bbf5e, main before both) against the tree by attn_ab; then test_gemm_fp4_e4m3.py,
#       bench_fp4_e4m3_route.py on the tree, and session 70's feeders (base = .ab-base.tar.gz of 1413932, main before
#       them) against the tree by exp_moe_contiguous_swapab.py. On an H100: final_suites (below) instead.
#   PART=final (~480 s): final_suites on whatever card comes.
#   PART=rest (~400 s): the rest of the runtime suite (parts A and B), then the runtime's core GPU tests in the time
#       left (run 2's final_suites, as it was then, gave them too little time on a cold machine: all three were cut).
# PART=moe: `git archive -o .ab-base.tar.gz 04d2411 packages/*/src runtime/src` and the same of 94d59de into
# .ab-mid.tar.gz; carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=moe bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s71
CASES="--cases 384x64 384x96 192x128 96x256 --variants contiguous_kernel swapab"
# final_suites: exp_l2_read_rate.py (the L2's read rate, beside the device copy), mini-deepgemm's GPU suite (the last
# whole run was session 65's), then gpu_session.sh's final_tree_checks (mini-flashmla's suite, the runtime's core GPU
# tests and the rest of the runtime suite). Run 2 ran this at 7217ab8, where it listed those suites itself with
# shorter limits, too short for a cold machine: the runtime's three were cut (PART=rest ran them again).
final_suites() {
  script_sides 60 exp_l2_read_rate.py l2 new
  grep -h "^| \|device copy" "$OUT"/l2_new.txt
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  final_tree_checks
  test_summary deepgemm_tests
}
case "${PART:-moe}" in
moe)
  fp4_e4m3_tests 120
  for side in base mid new; do script_sides 100 "exp_moe_contiguous_swapab.py $CASES" contig $side; done
  for side in base mid new; do fits 90 && route_sides 90 $side; done
  fits 100 && runtime_core_tests 95
  grep -h "^| " "$OUT"/contig_*.txt
  grep -h "^| contiguous" "$OUT"/route_*.txt
  test_summary fp4_e4m3_tests runtime_tests
  ;;
h200)
  if [ "$CARD" != h200 ]; then
    echo "not an H200 ($CARD): the final tree's suites instead"
    final_suites
  else
    attn_ab mid new
    fits 40 && fp4_e4m3_tests 40
    fits 70 && route_sides 65 new
    for side in base new; do fits 45 && script_sides 45 "exp_moe_contiguous_swapab.py $CASES" contig $side; done
    grep -h "^| " "$OUT"/contig_*.txt
    grep -h "^| contiguous\|^| masked" "$OUT"/route_*.txt
    test_summary fp4_e4m3_tests
  fi
  ;;
final)
  final_suites
  ;;
rest)
  rest_ab 100 190
  fits 60 && runtime_core_tests $((${DEADLINE:-540} - SECONDS - 10))
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b runtime_tests
  ;;
esac
pack_out
