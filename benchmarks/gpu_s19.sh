#!/usr/bin/env bash
# Session 19's GPU runs (docs/reports/gpu-session-2026-12-02-s19.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s19.sh   (1 x H200: exp_gemm_v41_partitions.py, prepared in
#       session 18: the V4.1 kernel with the producer as the default partition, A from registers or shared memory)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s19
PYTEST="python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning"
case "${PART:-r1}" in
r1)
  run partitions 300 bash -c "cd benchmarks && python3 exp_gemm_v41_partitions.py"
  cat "$OUT/summary.txt"; grep -E "^smoke|^\| " "$OUT/partitions.txt" | cut -c1-300 | tail -36
  tail -4 "$OUT/partitions.txt"
  ;;
esac
pack_out
