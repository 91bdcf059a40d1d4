#!/usr/bin/env bash
# Session 6's GPU runs (see docs/reports/gpu-session-2026-11-30-s6.md). PART selects what runs; files come back under $OUT.
#   source .devdeps/env.sh && PART=deepep bash benchmarks/gpu_s6.sh     (2 x H200)
# deepep_bench: only the benchmark, with BENCH_ARGS.
# final: test_dispatch_combine.py and the multi-GPU tests (closing check).
# prefill: the GPU tests of the RoPE / padding-row changes, the 1-GPU prefill benchmark, the EP2 x DP2 prefill (2 GPUs).
# deepep: mini-deepep's tests (2-GPU NVSHMEM incl. stress and lost peer), its benchmark under torchrun, then the
#         runtime's and integration tests' multi-GPU tests (they dispatch through the NVSHMEM backend).
set -u
FINAL=${OUT:-/tmp/gpu_s6}
OUT=/tmp/gpu_s6_work
source "$(dirname "$0")/gpu_session.sh" "$OUT"
mkdir -p "$FINAL"
case "${PART:-deepep}" in
  deepep)
    run deepep_tests 200 python3 -m pytest -v -rs -p no:cacheprovider packages/mini-deepep/tests \
      --junitxml="$FINAL/junit_deepep.xml"
    run deepep_bench 200 env OUT="$FINAL" python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_deepep.py \
      ${BENCH_ARGS:-}
    run multigpu 150 python3 -m pytest -v -rs -p no:cacheprovider runtime/tests integration_tests -m multigpu \
      --junitxml="$FINAL/junit_multigpu.xml"
    parts="env summary deepep_tests deepep_bench multigpu" ;;
  deepep_bench)  # the benchmark alone (sweeps through BENCH_ARGS)
    run deepep_bench 200 env OUT="$FINAL" python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_deepep.py \
      ${BENCH_ARGS:-}
    parts="env summary deepep_bench" ;;
  final)  # the closing check of the data kernels: dispatch/combine tests (2-GPU NVSHMEM), the multi-GPU tests
    run deepep_tests 100 python3 -m pytest -v -rs -p no:cacheprovider packages/mini-deepep/tests/test_dispatch_combine.py \
      --junitxml="$FINAL/junit_deepep.xml"
    run multigpu 150 python3 -m pytest -v -rs -p no:cacheprovider runtime/tests integration_tests -m multigpu \
      --junitxml="$FINAL/junit_multigpu.xml"
    parts="env summary deepep_tests multigpu" ;;
  prefill)  # the prefill leads' GPU tests, then the 1-GPU and EP2 x DP2 prefill benchmarks
    run prefill_tests 130 python3 -m pytest -q -rs -p no:cacheprovider -n 8 \
      packages/mini-deepgemm/tests/test_gemm_swapab.py packages/mini-deepgemm/tests/test_gemm.py \
      runtime/tests/test_moe_grouped.py runtime/tests/test_moe_kernels.py runtime/tests/test_reference_model.py \
      integration_tests/test_model_vs_reference.py -m "gpu and not multigpu" --junitxml="$FINAL/junit_prefill.xml"
    run prefill 80 python3 benchmarks/bench_prefill.py --out "$FINAL/prefill_h200.json"
    run prefill_ep2 150 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_prefill.py \
      --no-profile --out "$FINAL/prefill_ep2_h200.json"
    parts="env summary prefill_tests prefill prefill_ep2" ;;
esac
for f in $parts; do echo "=== $f"; cat "$OUT/$f.txt"; done > "$FINAL/log.txt" 2>&1
cat "$OUT/summary.txt"
grep -hE "FAILED|ERROR|passed|failed|Error" "$OUT"/deepep_tests.txt "$OUT"/multigpu.txt "$OUT"/prefill_tests.txt 2>/dev/null | tail -12
[ -f "$OUT/prefill.txt" ] && grep -E "40-layer|^moe|^proj|^attn|tok/s" "$OUT/prefill.txt" | tail -8
[ -f "$OUT/prefill_ep2.txt" ] && grep -E "40-layer|rror|tok/s" "$OUT/prefill_ep2.txt" | tail -4
[ -f "$OUT/deepep_bench.txt" ] && grep -E "^\(|^nvshmem|^layout|same_|combine_m" "$OUT/deepep_bench.txt"
true
