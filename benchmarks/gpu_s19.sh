#!/usr/bin/env bash
# Session 19's GPU runs (docs/reports/gpu-session-2026-12-02-s19.md); files under $OUT, packed by pack_out. Runs 2-10's
# experiment scripts (exp_gemm_fp8_moe.py, exp_gemm_fp8_masked.py) moved into the package after run 10 and were
# removed: those parts run from commit 6860ff7; runs 1-2's exp_gemm_v41_partitions.py from commit 3bc147e.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s19.sh   (1 x H200: exp_gemm_v41_partitions.py, prepared in
#       session 18: the V4.1 kernel with the producer as the default partition, A from registers or shared memory)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s19.sh   (1 x H200: run 1's experiment again (its smoke stopped
#       on a harness assertion), then exp_gemm_fp8_moe.py: the MoE prefill GEMM on FP8 MMAs with the weights
#       converted to e4m3 in shared memory)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s19.sh   (1 x H200: exp_gemm_fp8_moe.py again with the shipped
#       GEMM alone (no activation pass) and two breakdown variants: no conversion, no math; stopped on a KeyError: the
#       shipped config was asked without fp4=True, which also made run 2's "shipped" the swap-AB kernel)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s19.sh   (1 x H200: run 3 with the config fixed)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s19.sh   (1 x H200: exp_gemm_fp8_moe.py, version 2: a TMA
#       producer warp brings the packed weights into the ring, the converter reads them from shared memory)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s19.sh   (1 x H200: version 2 with the signs from two constant
#       byte permutes: 284 -> 221 SASS instructions per converter warp and step)
#   source .devdeps/env.sh && PART=r7 bash benchmarks/gpu_s19.sh   (1 x H200: run 6 again on the reviewed harness: the
#       shipped config named once)
#   source .devdeps/env.sh && PART=r8 bash benchmarks/gpu_s19.sh   (1 x H200: exp_gemm_fp8_masked.py, the masked decode
#       GEMM on FP8 MMAs with the same conversion; a refused start first)
#   source .devdeps/env.sh && PART=r9 bash benchmarks/gpu_s19.sh   (1 x H200: run 8 with tiles and ring depths swept:
#       run 8's 6 stages left 2 CTAs per SM)
#   source .devdeps/env.sh && PART=r10 bash benchmarks/gpu_s19.sh   (1 x H200: run 9 with an 80-register cap and a grid
#       with the token tiles fastest (16-token tiles at ~32 rows per expert))
#   source .devdeps/env.sh && PART=r11 bash benchmarks/gpu_s19.sh   (1 x H200, branch fp8-fp4-route: the route in the
#       package: every mini-deepgemm GPU test (with test_gemm_fp4_e4m3.py), then bench_fp4_e4m3_route.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s19
case "${PART:-r1}" in
r1)
  run partitions 300 bash -c "cd benchmarks && python3 exp_gemm_v41_partitions.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/partitions.txt" | cut -c1-300 | tail -36
  tail -4 "$OUT/partitions.txt"
  ;;
r2)
  run fp8_moe 240 bash -c "cd benchmarks && python3 exp_gemm_fp8_moe.py"
  run partitions 300 bash -c "cd benchmarks && python3 exp_gemm_v41_partitions.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/fp8_moe.txt" | cut -c1-300; tail -4 "$OUT/fp8_moe.txt"
  grep -E "^smoke|^\| " "$OUT/partitions.txt" | cut -c1-300 | tail -36; tail -4 "$OUT/partitions.txt"
  ;;
r3|r4|r5|r6|r7)
  run fp8_moe 300 bash -c "cd benchmarks && python3 exp_gemm_fp8_moe.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/fp8_moe.txt" | cut -c1-400; tail -3 "$OUT/fp8_moe.txt" | cut -c1-300
  ;;
r8|r9|r10)
  run fp8_masked 300 bash -c "cd benchmarks && python3 exp_gemm_fp8_masked.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/fp8_masked.txt" | cut -c1-400; tail -3 "$OUT/fp8_masked.txt" | cut -c1-300
  ;;
r11)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run route_bench 90 bash -c "cd benchmarks && python3 bench_fp4_e4m3_route.py"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/deepgemm_tests.txt" | tail -8
  grep -E "^\| " "$OUT/route_bench.txt"; tail -3 "$OUT/route_bench.txt" | cut -c1-300
  ;;
esac
pack_out
