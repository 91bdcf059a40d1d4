#!/usr/bin/env bash
# Session 4's closing GPU run on 1 x H200: every single-GPU test at the final tree, then the 1-GPU prefill benchmark
# (10 timed steps + profile), which is where the rows-per-group rule for 64 x 64 MoE tiles applies.
#   source .devdeps/env.sh && bash benchmarks/gpu_final_s4.sh
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_final_s4
run tests_1gpu 540 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning \
  packages runtime/tests integration_tests -m "not multigpu" -n 16 --junitxml="$OUT/junit_1gpu.xml"
run prefill 100 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
cat "$OUT/env.txt" "$OUT/summary.txt"
grep -E "FAILED|ERROR|passed|failed" "$OUT/tests_1gpu.txt" | tail -15
grep -E "40-layer|^moe|^projections|^indexer|^sparse|^top-k|^hc" "$OUT/prefill.txt" | tail -8
