#!/usr/bin/env bash
# Session 17's GPU runs (docs/reports/gpu-session-2026-12-01-s17.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s17.sh   (1 x H200: session 16's prepared
#       exp_gemm_masked_tiles.py --occupancy, then the first Nsight Compute profiles of the hot kernels
#       (profile_ncu.py's cases: full section set, SASS-level stall sampling; text exports of each report))
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s17.sh   (1 x H200: the activation pass of session 17
#       (programs of unused rows return, masked counts read in the kernel, FP4 order read as 2-byte pairs):
#       exp_activation_pass.py against session 16's, every mini-deepgemm GPU test, bench_deepgemm.py --graph, and
#       the masked and contiguous calls profiled again. Run 2 failed to compile (ROW_FILTER values were plain
#       globals); run 3 is the same part after the fix)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s17.sh   (1 x H200: the engine over the new activation pass:
#       the runtime's MoE and decode GPU tests with both integration files, the 1-GPU prefill step, the medium
#       model's decode at batch 32 and 64, 131k)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s17.sh   (1 x H200: the V4.1 kernel's fp32 scales through the
#       TMA ring: exp_gemm_v41_scale_ring.py against the UE8M0 words (stops if the smoke calls fail or differ), then
#       the V4.1 and swap-AB test files, the v41 profile again and bench_deepgemm.py --graph. Run 5 stopped at the
#       smoke: misaligned address (B's [4, 4] scale boxes made 64-byte ring slots; a TMA destination must be
#       128-byte aligned); run 6 is the same part after the fix)
#   source .devdeps/env.sh && PART=r7 bash benchmarks/gpu_s17.sh   (1 x H200, refused: no device time left. For the
#       next session, on branch v41-ring-flop-threshold (the ring from 2e10 FLOPs): the V4.1 test file, the 1-GPU
#       prefill step, bench_deepgemm.py --graph; on main (the ring from 1,024 rows) the same part measures the
#       shipped routing)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s17
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
case "${PART:-r1}" in
r1)
  "$NCU" --version > "$OUT/ncu_version.txt" 2>&1
  run occupancy 150 bash -c "cd benchmarks && python3 exp_gemm_masked_tiles.py --occupancy"
  ncu_profile v41 cublas_fp8 v3 moe_w13 masked_w13 sparse_prefill sparse_decode indexer
  cat "$OUT/summary.txt" "$OUT/ncu_version.txt"; tail -5 "$OUT/occupancy.txt"
  ls -la "$OUT/ncu"; grep -h -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput" "$OUT"/ncu/*_details.txt | head -60
  ;;
r2)
  run activation_pass 120 bash -c "cd benchmarks && python3 exp_activation_pass.py"
  run deepgemm_tests 180 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  ncu_profile masked_w13 moe_w13
  cat "$OUT/summary.txt"; grep -E "speedup" "$OUT/activation_pass.txt" | cut -c1-330
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/deepgemm_tests.txt" | tail -8
  grep -E "MoE|masked|w13|w2|geomean" "$OUT/deepgemm/table.md" | tail -14
  python3 benchmarks/ncu_summary.py "$OUT/ncu" masked_w13 moe_w13 > "$OUT/ncu_summary.txt"; head -8 "$OUT/ncu_summary.txt"
  ;;
r4)
  run runtime_tests 200 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run prefill 150 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run decode_b32_b64 130 python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
    --kv-cache-gb 8 --profile --out "$OUT/decode_medium_b32_b64_h200.json"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_tests.txt" | tail -10
  tail -28 "$OUT/prefill.txt"; grep -E "ms/step|bench_decode:" "$OUT/decode_b32_b64.txt"
  ;;
r5)
  run v41_ring 200 bash -c "cd benchmarks && python3 exp_gemm_v41_scale_ring.py"
  if grep -q "^v41_ring rc=0" "$OUT/summary.txt"; then
    run v41_tests 120 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py \
      packages/mini-deepgemm/tests/test_gemm_swapab.py packages/mini-deepgemm/tests/test_gemm.py -m gpu
    ncu_profile v41
    python3 benchmarks/ncu_summary.py "$OUT/ncu" v41 > "$OUT/ncu_summary.txt"; head -4 "$OUT/ncu_summary.txt"
      run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  fi
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/v41_ring.txt" | tail -26; tail -20 "$OUT/v41_ring.txt" | grep -i error
  grep -E " (FAILED|ERROR) |passed|failed" "$OUT/v41_tests.txt" | tail -8
  grep -E "geomean|MoE|masked" "$OUT/deepgemm/table.md" | tail -4
  ;;
r7)
  run v41_tests 90 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py
  run prefill 60 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run deepgemm 90 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/v41_tests.txt" | tail -6
  grep -E "40-layer|projections|moe experts" "$OUT/prefill.txt"; grep -E "wkv|geomean" "$OUT/deepgemm/table.md"
  ;;
esac
pack_out
