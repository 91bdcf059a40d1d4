#!/usr/bin/env bash
# Session 18's GPU runs (docs/reports/gpu-session-2026-12-01-s18.md); files under $OUT, packed by pack_out.
# exp_gemm_v41_stages.py and exp_gemm_v41_partitions.py were removed in session 19: commit 3bc147e has them.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s18.sh   (1 x H200, carry out/v41_s17.py = git show
#       62bf345:packages/mini-deepgemm/src/mini_deepgemm/gemm_gluon_fp8_kernel.py: the V4.1 kernel's one
#       m64n128k32 MMA per 32 of K: the V4.1 / GEMM / swap-AB test files, exp_gemm_v41_one_mma.py against session
#       17's kernel, the v41 profile again, bench_deepgemm.py --graph)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s18.sh   (1 x H200: the ring from 8e10 FLOPs per call: every
#       mini-deepgemm GPU test, the runtime's MoE / decode GPU tests with both integration files, the 1-GPU prefill
#       step, bench_deepgemm.py --graph)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s18.sh   (1 x H200: the prefill step again with host times
#       per layer and --sync-report (run 2's layers 0 and 2 ran 4.5-6.5 ms over their kernel time), then
#       exp_gemm_v41_stages.py (a 5-deep ring))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s18.sh   (1 x H200: the prefill step with the profile's host
#       time and kernel launches per stage)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s18.sh   (1 x H200: the prefill step with its timed steps
#       back to back (the new default), then waited for one by one (--sync-steps, sessions <= 17), same machine)
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s18.sh   (1 x H200: the runtime GPU tests that runs 2 did not
#       run (session 16 run 6's runtime_rest: ~470 s))
#   source .devdeps/env.sh && PART=next bash benchmarks/gpu_s18.sh   (1 x H200, prepared, not run: the V4.1 kernel with
#       the producer as the default partition, A from registers or shared memory, exp_gemm_v41_partitions.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s18
case "${PART:-r1}" in
r1)
  run v41_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py \
    packages/mini-deepgemm/tests/test_gemm_swapab.py packages/mini-deepgemm/tests/test_gemm.py -m gpu
  run one_mma 200 bash -c "cd benchmarks && python3 exp_gemm_v41_one_mma.py --before ../out/v41_s17.py"
  ncu_profile v41
  python3 benchmarks/ncu_summary.py "$OUT/ncu" v41 > "$OUT/ncu_summary.txt"
  gzip "$OUT"/ncu/*.txt "$OUT"/ncu/*.csv
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/v41_tests.txt" | tail -8
  grep -E "^smoke|^\| " "$OUT/one_mma.txt" | cut -c1-400 | tail -26
  tail -5 "$OUT/one_mma.txt" | grep -i -E "error|differs"
  head -6 "$OUT/ncu_summary.txt"; grep -E "geomean" "$OUT/deepgemm/table.md" | tail -4
  ;;
r2)
  run deepgemm_tests 180 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 200 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run prefill 150 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  run deepgemm 100 bash -c "cd benchmarks && python3 bench_deepgemm.py --graph --out $OUT/deepgemm"
  cat "$OUT/summary.txt"
  for f in deepgemm_tests runtime_tests; do grep -E " (FAILED|ERROR) |passed|failed" "$OUT/$f.txt" | tail -6; done
  tail -28 "$OUT/prefill.txt"; grep -E "geomean" "$OUT/deepgemm/table.md" | tail -4
  ;;
r3)
  run prefill 150 python3 benchmarks/bench_prefill.py --sync-report --out "$OUT/prefill_h200.json"
  run stages 150 bash -c "cd benchmarks && python3 exp_gemm_v41_stages.py"
  cat "$OUT/summary.txt"; tail -48 "$OUT/prefill.txt"; grep -E "^\| " "$OUT/stages.txt"; tail -3 "$OUT/stages.txt"
  ;;
r4)
  run prefill 150 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
  cat "$OUT/summary.txt"; tail -30 "$OUT/prefill.txt"
  ;;
r5)
  run prefill 150 python3 benchmarks/bench_prefill.py --sync-report --out "$OUT/prefill_h200.json"
  run prefill_sync_steps 150 python3 benchmarks/bench_prefill.py --sync-steps --no-profile \
    --out "$OUT/prefill_sync_steps_h200.json"
  cat "$OUT/summary.txt"; tail -32 "$OUT/prefill.txt"; tail -14 "$OUT/prefill_sync_steps.txt"
  ;;
r6)
  run runtime_rest 520 $PYTEST runtime/tests integration_tests -m "not multigpu" -n 16 $RUNTIME_CORE_IGNORES \
    --junitxml="$OUT/junit_runtime_rest.xml"
  cat "$OUT/summary.txt"; grep -E " (FAILED|ERROR) |passed|failed" "$OUT/runtime_rest.txt" | tail -15
  ;;
next)
  run partitions 300 bash -c "cd benchmarks && python3 exp_gemm_v41_partitions.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/partitions.txt" | cut -c1-300 | tail -36
  ;;
esac
pack_out
