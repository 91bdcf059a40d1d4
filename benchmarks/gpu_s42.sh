#!/usr/bin/env bash
# Session 42's GPU runs (docs/reports/gpu-session-2026-12-04-s42.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s42.sh   (1 x H200, tree = main + the V4.1 recipe's split-K
#       kernel at decode sizes): the V4.1 GEMM tests and the dense batch-invariance test of mini-deepgemm;
#       bench_dense_decode with its slice / ring sweep (timed by do_bench: the host's launch time, not the kernels)
#   PART=r1b (bench_dense_decode timed by CUDA-graph replay over weight copies): bench_dense_decode --sweep
#   PART=r2 (the split-K kernel routed by _splitk_runs, 3 stages): the V4.1 GEMM tests again, the runtime's core GPU
#       tests, bench_dense_decode without the sweep
#   PART=r3 (.ab-base.tar.gz = 00e1a4b, .ab-mid.tar.gz = the split-K commit with run 3's routing rule, both
#       carried: the runtime's working tree held a helper's unfinished routing change): the V4.1 GEMM tests (the
#       routing test's cases changed); bench_decode (all seven sample layers, batch 32 / 64, --profile) on mid and
#       base
#   PART=r4 (tree = bf116da: the masked kernel's one-partial K loop, ONE_PART, and exp_moe_masked_tiles with its
#       variants; reverted by f586d0a, so on main the script runs the routed tiles only): the FP8-MMA route's GPU
#       tests (test_gemm_fp4_e4m3.py); exp_moe_masked_tiles
#   PART=r6 (tree = main: split-K, the routing kernels; the final source tree): the routing and linear_fp32 tests,
#       the runtime's core GPU tests, bench_decode on the tree (run 4's mid side is the cross-run reference), the rest
#       of the runtime's GPU suite
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s42
case "${PART:-r1}" in
r1)
  v41_tests 240
  run dense_decode 240 python3 benchmarks/bench_dense_decode.py --sweep --out "$OUT"
  cat "$OUT/summary.txt"; test_summary v41_tests
  grep -E "^\|" "$OUT/dense_decode.txt"; grep -m3 -E "Error|error" "$OUT/dense_decode.txt" | cut -c1-300
  ;;
r1b)
  run dense_decode 240 python3 benchmarks/bench_dense_decode.py --sweep --out "$OUT"
  cat "$OUT/summary.txt"; grep -E "^\|" "$OUT/dense_decode.txt"
  grep -m3 -E "Error|error" "$OUT/dense_decode.txt" | cut -c1-300
  ;;
r2)
  v41_tests 150
  run runtime_tests 150 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run dense_decode 120 python3 benchmarks/bench_dense_decode.py --out "$OUT"
  cat "$OUT/summary.txt"; test_summary v41_tests runtime_tests; grep -E "^\|" "$OUT/dense_decode.txt"
  ;;
r3)
  run v41_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py --junitxml="$OUT/junit_v41.xml"
  decode_all_sides mid base
  cat "$OUT/summary.txt"; test_summary v41_tests
  grep -hE "graphs=1|^projections |^moe experts |^stage" "$OUT/decode_mid.txt" "$OUT/decode_base.txt"
  ;;
r4)
  fp4_e4m3_tests 200
  script_sides 200 exp_moe_masked_tiles.py masked_tiles new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests
  grep -E "^\|" "$OUT/masked_tiles_new.txt"; grep -m3 -E "Error|error" "$OUT/masked_tiles_new.txt" | cut -c1-300
  ;;
r6)
  tree_checks route_tests 120 "moe routing|projections" runtime/tests/test_moe_route.py \
    runtime/tests/test_linear_fp32.py
  ;;
esac
pack_out
