#!/usr/bin/env bash
# Session 4's GPU experiment (docs/reports/deepgemm-fp4-ptx.md): the FP4 -> bf16 conversion of the swap-AB kernel
# in inline PTX. Its GPU tests, the MoE GEMMs at 1-GPU / EP2 / EP4 routing with the conversion in integer ops and
# in PTX, then the 1-GPU prefill benchmark (3 timed steps, with the profile).
#   source .devdeps/env.sh && bash benchmarks/gpu_exp_fp4_ptx.sh
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_exp_fp4_ptx
run tests 200 python3 -m pytest -q -rs -p no:cacheprovider -n 8 packages/mini-deepgemm/tests/test_gemm_swapab.py \
  packages/mini-deepgemm/tests/test_gemm.py runtime/tests/test_moe_grouped.py
run moe 240 python3 benchmarks/exp_gemm_swapab.py --fp4-ptx --out "$OUT/exp"
run prefill 220 python3 benchmarks/bench_prefill.py --steps 3 --out "$OUT/prefill_h200.json"
cat "$OUT/env.txt" "$OUT/summary.txt"
grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.txt" | tail -12
grep -E "moe_real|Error" "$OUT/moe.txt" | sed -E "s/'(kind|name|padded_rows|diff_vs_current)': [^,]*, //g" | tail -40
grep -E "40-layer|^hc|^moe|^top-k|^projections|^indexer|^sparse|dispatch|norms" "$OUT/prefill.txt" | tail -14
