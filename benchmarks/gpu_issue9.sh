#!/usr/bin/env bash
# Issue 9 on 4 x H200 (kind nvidia-h200-x4, never lent through session 13): two device calls, files under $OUT.
#   source .devdeps/env.sh && PART=tests bash benchmarks/gpu_issue9.sh   (the multi-GPU tests: mini-deepep's NVSHMEM
#       tests incl. the 4-GPU scenarios, EP x DP on 2 and 4 GPUs against the single-process model, the data-parallel
#       engines)
#   source .devdeps/env.sh && PART=bench bash benchmarks/gpu_issue9.sh   (the official prefill workload as EP4 x DP4,
#       10 steady-state steps, every sample layer at real size; mini-deepep's benchmark at 4 ranks against NCCL)
# Each part fits one 600 s call; the limits below are guesses from the 2-GPU runs (EP2 prefill ~150 s with its
# weight build, the 2-GPU tests ~170 s).
set -u
source benchmarks/gpu_session.sh /tmp/gpu_issue9
PYTEST="python3 -m pytest -q -rs -s -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning"
case "${PART:-tests}" in
tests)
  run deepep_tests 200 $PYTEST packages/mini-deepep/tests -m multigpu --junitxml="$OUT/junit_deepep.xml"
  run multigpu_tests 330 $PYTEST runtime/tests integration_tests -m multigpu --junitxml="$OUT/junit_multigpu.xml"
  cat "$OUT/summary.txt"; tail -4 "$OUT/deepep_tests.txt"; tail -6 "$OUT/multigpu_tests.txt"
  ;;
bench)
  run prefill_ep4 330 python3 -m torch.distributed.run --nproc-per-node 4 benchmarks/bench_prefill.py \
    --no-profile --out "$OUT/prefill_ep4_h200.json"
  run deepep_4 200 python3 -m torch.distributed.run --nproc-per-node 4 benchmarks/bench_deepep.py --sweep-sms 132
  cat "$OUT/summary.txt"; grep -E "40-layer|Error|error" "$OUT/prefill_ep4.txt" | tail -8; tail -30 "$OUT/deepep_4.txt"
  ;;
esac
pack_out
