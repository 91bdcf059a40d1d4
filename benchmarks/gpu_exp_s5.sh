#!/usr/bin/env bash
# Session 5's second GPU experiment: the swap-AB scale words on the dense prefill shapes, the mini-deepgemm table
# (bench_deepgemm.py, API defaults), the 1-GPU prefill benchmark and the medium decode benchmark at the new tiles.
#   source .devdeps/env.sh && bash benchmarks/gpu_exp_s5.sh
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_exp_s5
run words 120 python3 benchmarks/exp_gemm_swapab.py --scale-words --out "$OUT/words"
run deepgemm 200 python3 benchmarks/bench_deepgemm.py --out "$OUT/deepgemm"
run prefill 120 python3 benchmarks/bench_prefill.py --out "$OUT/prefill_h200.json"
run decode 100 python3 benchmarks/bench_decode.py --preset medium --batches 8,64 --contexts 1024 --out "$OUT/decode_medium_h200.json"
cat "$OUT/env.txt" "$OUT/summary.txt"
tail -32 "$OUT/deepgemm.txt"
grep -E "40-layer|^moe|^projections|^indexer|^sparse|^top-k|^hc" "$OUT/prefill.txt" | tail -8
tail -6 "$OUT/decode.txt"
rm -f "$OUT/words/rows.json"
