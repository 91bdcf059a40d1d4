#!/usr/bin/env bash
# Session 5's benchmark run on 1 x H200: the fused MoE glue kernels (their GPU tests, then bench_moe_glue.py), the
# mini-deepgemm table at M = 4,096 (bench_deepgemm.py, API defaults), the 1-GPU prefill and the medium decode
# benchmarks. Five files come back under $OUT: log.txt and four JSONs.
#   source .devdeps/env.sh && OUT=... bash benchmarks/gpu_bench_s5.sh
set -u
FINAL=${OUT:-/tmp/gpu_bench_s5}
OUT=/tmp/gpu_bench_s5_work
source "$(dirname "$0")/gpu_session.sh" "$OUT"
run glue_tests 150 python3 -m pytest -v -s -rs -p no:cacheprovider -m gpu runtime/tests/test_moe_kernels.py \
  runtime/tests/test_moe_grouped.py
run glue_bench 120 python3 benchmarks/bench_moe_glue.py --sweep --out "$OUT/bench_moe_glue.json"
run deepgemm 150 python3 benchmarks/bench_deepgemm.py --m 4096 --out "$OUT/deepgemm"
run prefill 70 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
run decode 60 python3 benchmarks/bench_decode.py --preset medium --batches 8,64 --contexts 1024 --out "$OUT/decode_medium_h200.json"
mkdir -p "$FINAL"
for f in env summary glue_tests glue_bench deepgemm prefill decode; do echo "=== $f"; cat "$OUT/$f.txt"; done > "$FINAL/log.txt" 2>&1
cp "$OUT/bench_moe_glue.json" "$OUT/prefill_h200.json" "$OUT/decode_medium_h200.json" "$FINAL/" 2>/dev/null
cp "$OUT/deepgemm/results.json" "$FINAL/bench_deepgemm_results.json" 2>/dev/null
cat "$OUT/summary.txt"
grep -E "passed|failed|FAILED|Error" "$OUT/glue_tests.txt" | tail -8
tail -40 "$OUT/deepgemm.txt"
grep -E "40-layer|^moe|^projections" "$OUT/prefill.txt" | tail -4
grep -E "graphs=1" "$OUT/decode.txt"
