#!/usr/bin/env bash
# Session 78's GPU calls (the Triton route, MINI_DEEPGEMM_GLUON=0).
#   PART=blockh: exp_attn_block_h.py (the Triton attention with 32 or 16 heads per program, two or four programs per
#       SM, against the API's 64-head launch: paged prefill and decode batch 8-256). On an H200 it then runs what
#       sessions 76-77 owed there (gpu_s77.sh PART=h200's parts: bench_flashmla and bench_fp4_e4m3_route on the
#       Triton route, bench_decode on both routes in one call).
#   PART=v3ws (the Triton route; run 2, ~440 s on an H100, every step cut by its limit: the kernel hung):
#       exp_gemm_v3_triton_ws.py at M = 4,096 (the dense V3-recipe GEMM on TMA loads, with and without triton's Hopper
#       warp specialization, against gemm_kernel's tile and cuBLAS), mini-deepgemm's test_gemm.py (run 2 also ran
#       the kernel's own tests, test_gemm_v3_ws.py, removed with the route) and the runtime's core GPU tests (the
#       tree then sent dense V3 calls to the kernel), then the experiment at M = 16,384. Runs 3-4 were inline calls
#       (exp_ws_hang.py; the experiment at 64-row tiles), their output kept in data/s78-run3, -run4.
# carry [".devdeps"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s78
case "${PART:-blockh}" in
blockh)
  export MINI_DEEPGEMM_GLUON=0
  script_sides 240 exp_attn_block_h.py block_h new
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    fits 150 && flashmla_sides 150 triton
    fits 100 && route_sides 100 triton
    fits 100 && decode_bench decode_triton
    unset MINI_DEEPGEMM_GLUON
    fits 100 && decode_bench decode_gluon
  fi
  cat "$OUT/summary.txt"
  grep -h "^| " "$OUT"/block_h_new.txt | cut -c1-400
  grep -hE "^\| (prefill_(paged|bf16)_tflops|decode)" "$OUT"/flashmla_triton.txt 2>/dev/null | cut -c1-300
  grep -h "^| contiguous\|^| masked" "$OUT"/route_*.txt 2>/dev/null
  grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
  ;;
v3ws)
  export MINI_DEEPGEMM_GLUON=0
  script_sides 150 exp_gemm_v3_triton_ws.py v3ws_m4096 new
  run v3ws_tests 90 $PYTEST -n 4 packages/mini-deepgemm/tests/test_gemm.py -m gpu --junitxml="$OUT/junit_v3ws.xml"
  fits 170 && runtime_core_tests 170
  fits 120 && M=16384 script_sides 120 exp_gemm_v3_triton_ws.py v3ws_m16384 new
  cat "$OUT/summary.txt"
  grep -h "^| \|^M = " "$OUT"/v3ws_*.txt | cut -c1-400
  test_summary v3ws_tests runtime_tests
  ;;
esac
pack_out
