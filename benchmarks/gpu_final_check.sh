#!/usr/bin/env bash
# A short closing GPU session: the GPU tests of files changed since the last full suite, then the prefill
# benchmark (profile + bounded replay) and one decode point. At most 8 files come back from $OUT.
#   source .devdeps/env.sh && TESTS="..." bash benchmarks/gpu_final_check.sh
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_final_check
run tests "${TEST_SECS:-130}" python3 -m pytest -q -rs -s -p no:cacheprovider -m "not multigpu" -n "${WORKERS:-8}" $TESTS
run prefill "${PREFILL_SECS:-180}" python3 benchmarks/bench_prefill.py --bounded-replay "${KEEP:-140,2414}" \
  --out "$OUT/prefill_h200.json"
if [ -n "${DECODE_BATCHES:-}" ]; then
  run decode "${DECODE_SECS:-70}" python3 benchmarks/bench_decode.py --preset medium --batches "$DECODE_BATCHES" \
    --contexts 1024 --warmup 2 --steps 5 --out "$OUT/decode_medium_h200.json"
fi
cat "$OUT/summary.txt"
grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.txt" | tail -15
grep -E "40-layer|bounded replay|^hc|^moe|^top-k|^projections|^indexer|^sparse" "$OUT/prefill.txt" | tail -14
if [ -f "$OUT/decode.txt" ]; then grep -E "ms/step" "$OUT/decode.txt" | tail -8; fi  # an `if`: a last `[ ] &&` made the rc 1 without a decode run
