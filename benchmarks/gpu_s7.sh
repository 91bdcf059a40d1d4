#!/usr/bin/env bash
# Session 7's GPU runs (see docs/reports/gpu-session-2026-11-30-s7.md). PART selects what runs; files come back under $OUT.
#   source .devdeps/env.sh && PART=deepep bash benchmarks/gpu_s7.sh     (2 x H200)
# deepep: the dispatch/combine tests (2-GPU NVSHMEM), then the benchmark of the session's starting tree (its
#         mini_deepep copied under _baseline/ by the caller, defaults only) and of this tree (sweeps: BENCH_ARGS).
# final: mini-deepep's tests, the multi-GPU tests of the runtime and integration tests, the benchmark (closing check).
set -u
FINAL=${OUT:-/tmp/gpu_s7}
OUT=/tmp/gpu_s7_work
source "$(dirname "$0")/gpu_session.sh" "$OUT"
mkdir -p "$FINAL/base"
bench() {  # bench NAME OUTDIR [PYTHONPATH prefix] -- args
  local name=$1 dir=$2 pp=$3; shift 3
  run "$name" 240 env OUT="$dir" PYTHONPATH="$pp$PYTHONPATH" python3 -m torch.distributed.run --nproc-per-node 2 \
    benchmarks/bench_deepep.py "$@"
}
case "${PART:-deepep}" in
  deepep)
    run deepep_tests 150 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepep/tests/test_dispatch_combine.py \
      --junitxml="$FINAL/junit_deepep.xml"
    if [ -d _baseline/packages/mini-deepep/src ]; then
      bench deepep_bench_base "$FINAL/base" "$PWD/_baseline/packages/mini-deepep/src:" --sweep-sms 132 --sweep-shares 0.25 \
        --sweep-dispatch-tiles --sweep-combine-tiles
    fi
    bench deepep_bench "$FINAL" "" ${BENCH_ARGS:-}
    parts="env summary deepep_tests deepep_bench_base deepep_bench" ;;
  final)
    run deepep_tests 250 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepep/tests \
      --junitxml="$FINAL/junit_deepep.xml"
    run multigpu 200 python3 -m pytest -q -rs -p no:cacheprovider runtime/tests integration_tests -m multigpu \
      --junitxml="$FINAL/junit_multigpu.xml"
    bench deepep_bench "$FINAL" "" ${BENCH_ARGS:-}
    parts="env summary deepep_tests multigpu deepep_bench" ;;
esac
for f in $parts; do echo "=== $f"; cat "$OUT/$f.txt" 2>/dev/null; done > "$FINAL/log.txt" 2>&1
cat "$OUT/summary.txt"
grep -hE "FAILED|ERROR|passed|failed|Error" "$OUT"/deepep_tests.txt "$OUT"/multigpu.txt 2>/dev/null | tail -12
for b in deepep_bench_base deepep_bench; do
  [ -f "$OUT/$b.txt" ] && { echo "--- $b"; grep -E "^\(|^nvshmem|^layout|same_|combine_m" "$OUT/$b.txt"; }
done
true
