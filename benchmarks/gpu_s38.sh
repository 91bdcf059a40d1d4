#!/usr/bin/env bash
# Session 38's GPU runs (docs/reports/gpu-session-2026-12-04-s38.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s38.sh   (1 x H200, tree = main: the runtime's core GPU
#       tests (session 37's capture mend 1cfaf2e had not run on a GPU), exp_moe_converter_sync)
#   PART=r2: the same, after the first try's run 1 was lost with it (warp4 partitions reordered, differing rows)
#   PART=r3: exp_moe_converter_sync's raw8 with its raw-slot release after a proxy fence, or after the B store
#   PART=r4 (.ab-base.tar.gz = be332d9^'s src folders, carried): the mini-deepgemm GPU suite (the V4.1 kernel's
#       fence), exp_gemm_v41_scale_ring on new and base (the ring's cost of the fence)
#   PART=r5: Nsight Compute on the contiguous MoE kernel at 384 experts of 32-96 rows, w13: shipped, warp4, raw8_fence
#   PART=r6: exp_moe_contiguous_m256 (256-row tiles); Nsight Compute on it and the shipped kernel at 96 experts, w13
#   PART=r7: exp_moe_contiguous_m256 again (r6's stopped at its peer's operands)
#   PART=r8 (.ab-base.tar.gz = the src folders before the 256-row tiles, carried): the mini-deepgemm GPU suite,
#       bench_fp4_e4m3_route on new and base, the runtime's core GPU tests, bench_prefill on new and base
#   PART=r9: after the 256-row tiles' threshold moved to 512 rows per expert: test_gemm_fp4_e4m3.py, the route
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s38
case "${PART:-r1}" in
r1|r2)
  run exp_moe_sync 360 env OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_converter_sync.py"
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary runtime_tests
  grep -E "^(==|   )" "$OUT/exp_moe_sync.txt"; grep -m3 -E "error|Error" "$OUT/exp_moe_sync.txt" | cut -c1-400
  ;;
r3)
  run exp_moe_sync 200 env OUT="$OUT" VARIANTS=raw8,raw8_fence,raw8_late \
    bash -c "cd benchmarks && python3 exp_moe_converter_sync.py"
  grep -E "^(==|   )" "$OUT/exp_moe_sync.txt"; grep -m3 -E "error|Error" "$OUT/exp_moe_sync.txt" | cut -c1-400
  ;;
r4)
  run deepgemm_tests 170 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  for side in new base; do
    run "v41_ring_$side" 180 env PYTHONPATH="$(side_path $side)" OUT="$OUT/v41_ring_$side" \
      bash -c "mkdir -p \$OUT && cd benchmarks && python3 exp_gemm_v41_scale_ring.py"
  done
  cat "$OUT/summary.txt"; test_summary deepgemm_tests
  for side in new base; do echo "== $side"; grep -E "^\|" "$OUT/v41_ring_$side.txt" | head -30; done
  ;;
r5)
  NCU_SECS=100 ncu_profile exp_moe_converter_sync:profile_call:shipped exp_moe_converter_sync:profile_call:warp4 \
    exp_moe_converter_sync:profile_call:raw8_fence
  cat "$OUT/summary.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -150
  ;;
r6|r7)
  run exp_m256 240 env OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_contiguous_m256.py"
  [ "$PART" = r6 ] && NCU_SECS=100 ncu_profile exp_moe_contiguous_m256:profile_call:shipped \
    exp_moe_contiguous_m256:profile_call:m256
  cat "$OUT/summary.txt"
  grep -E "^==" "$OUT/exp_m256.txt"; grep -m3 -E "error|Error" "$OUT/exp_m256.txt" | cut -c1-400
  [ "$PART" = r6 ] && python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -60
  ;;
r8)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  route_sides 90 new base
  run runtime_tests 100 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  prefill_sides 80 new
  prefill_sides 50 base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for side in new base; do
    echo "== route $side"
    grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' "$OUT/route_$side.txt" \
      | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  done
  show_sides new base
  ;;
r9)
  run fp4_e4m3_tests 100 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py --junitxml="$OUT/junit_fp4.xml"
  route_sides 90 new
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests
  grep -o '"groups": [0-9]*, "name": "w[0-9]*".*"tflops_fp8_route_fold128": [0-9.]*' "$OUT/route_new.txt" \
    | sed -E 's/"N".*"tflops_fp8_route_fold128"/ fold128/'
  ;;
esac
pack_out
