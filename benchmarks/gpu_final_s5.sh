#!/usr/bin/env bash
# Session 5's closing GPU runs. 1 x H200: every single-GPU test at the final tree (SUITE=1). 2 x H200 (SUITE=2):
# the multi-GPU tests, then on GPU 0 the MoE glue benchmark, the 1-GPU prefill and the medium decode benchmarks, and
# the EP2 x DP2 prefill on both (EP2=0 skips it). Files back under $OUT: log.txt plus the JSONs.
#   source .devdeps/env.sh && SUITE=1 OUT=... bash benchmarks/gpu_final_s5.sh
set -u
FINAL=${OUT:-/tmp/gpu_final_s5}
OUT=/tmp/gpu_final_s5_work
source "$(dirname "$0")/gpu_session.sh" "$OUT"
mkdir -p "$FINAL"
if [ "${SUITE:-1}" = 1 ]; then
  run tests_1gpu 540 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning \
    packages runtime/tests integration_tests -m "not multigpu" -n 16 --junitxml="$FINAL/junit_1gpu.xml"
  parts="env summary tests_1gpu"
else
  run tests_2gpu 200 python3 -m pytest -v -rs -p no:cacheprovider packages runtime/tests integration_tests -m multigpu \
    --junitxml="$FINAL/junit_2gpu.xml"
  run glue_bench 60 python3 benchmarks/bench_moe_glue.py --out "$FINAL/bench_moe_glue.json"
  run prefill 70 python3 benchmarks/bench_prefill.py --out "$FINAL/prefill_h200.json"
  run decode 60 python3 benchmarks/bench_decode.py --preset medium --batches 8,64 --contexts 1024 \
    --out "$FINAL/decode_medium_h200.json"
  if [ "${EP2:-1}" = 1 ]; then
    run prefill_ep2 150 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_prefill.py \
      --no-profile --out "$FINAL/prefill_ep2_h200.json"
  fi
  parts="env summary tests_2gpu glue_bench prefill decode $([ "${EP2:-1}" = 1 ] && echo prefill_ep2)"
fi
for f in $parts; do echo "=== $f"; cat "$OUT/$f.txt"; done > "$FINAL/log.txt" 2>&1
cat "$OUT/summary.txt"
grep -hE "FAILED|ERROR|passed|failed" "$OUT"/tests_*.txt | tail -15
[ -f "$OUT/glue_bench.txt" ] && grep -E "swiglu|total" "$OUT/glue_bench.txt"
[ -f "$OUT/prefill.txt" ] && grep -E "40-layer|^moe" "$OUT/prefill.txt" | tail -4
[ -f "$OUT/decode.txt" ] && grep -E "graphs=1" "$OUT/decode.txt"
[ -f "$OUT/prefill_ep2.txt" ] && grep -E "40-layer|rror" "$OUT/prefill_ep2.txt" | tail -4
true
