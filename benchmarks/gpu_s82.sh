#!/usr/bin/env bash
# Session 82's GPU calls.
#   PART=bench (~450 s on a fresh H100 or H200): session 81's owed mixed step and the engine end to end.
#       bench_prefill --mix on session 80's final tree (base, 917e97f: the indexer per sequence) and this one (the
#       indexer in groups by publisher and entry bucket), four real-width layers (window, window+engram, ratio-2 FULL,
#       REUSE), then the ratio-1 FULL + REINDEX pair: one sequence's 2,048-token chunk at 131,072 of context beside 32
#       fresh 64-token prompts, and a 3,584-token chunk at 32,768 beside 8 fresh 64-token prompts. Then
#       bench_throughput (medium model, 256 requests of 100-1,024 prompt and 100-1,024 output tokens, one warm-up and
#       two timed passes) on this tree, cd8398e (mid, before session 80) and base; on an H200 (its memory) the whole
#       official prefill step (seven sample layers, 40-layer equivalent) on this tree after the first of these.
#   PART=new (~300 s): this tree's throughput again with room for a cold warm-up, one mixed step's host profile by
#       function (bench_prefill --py-profile), and the 32k mix on both trees once more (new first).
# `git archive -o .ab-base.tar.gz 917e97f packages/*/src runtime/src`; `git archive -o .ab-mid.tar.gz cd8398e
# packages/*/src runtime/src`; carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=bench bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s82
mix_sides() {  # NAME MIX LAYERS SIDES: bench_prefill --mix on each side
  local name=$1 mix=$2 which=$3 sides=$4 side
  for side in $sides; do
    fits 50 && run "${name}_$side" 100 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      --steps 4 --fp8-size 2048 --layers "$which" --mix "$mix" --out "$OUT/${name}_${side}_$CARD.json"
  done
}
case "${PART:-bench}" in
bench)
  four=window,window+engram,r2-full,r2-reuse
  mix_sides mix_long131k 1x2048@131072,32x64@64 $four "base new"
  mix_sides mix_long32k 1x3584@32768,8x64@64 $four "base new"
  mix_sides mix_long131k_r1 1x2048@131072,32x64@64 r1-full,r1-reindex "base new"
  run throughput_new 150 python3 benchmarks/bench_throughput.py --preset medium --out "$OUT/throughput_new_$CARD.json"
  if [ "${GPU_MIB:-0}" -gt 100000 ]; then  # the whole step (seven sample layers) needs an H200's memory
    fits 200 && run step40_new 240 python3 benchmarks/bench_prefill.py --steps 5 --out "$OUT/step40_new_$CARD.json"
  fi
  for side in mid base; do
    fits 60 && run "throughput_$side" 150 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_throughput.py \
      --preset medium --out "$OUT/throughput_${side}_$CARD.json"
  done
  cat "$OUT/summary.txt"
  grep -hE "^ +[0-9]+ (window|r[12])|step as run|tokens .* in |40-layer" "$OUT"/mix_*.txt "$OUT"/step40*.txt \
    | cut -c1-160
  grep -hE "pass [0-9]" "$OUT"/throughput_*.txt | cut -c1-260
  ;;
new)  # run 1's throughput_new ran out of its 150 s in the warm-up pass (the machine's first, cold Triton cache)
  run throughput_new 240 python3 benchmarks/bench_throughput.py --preset medium --out "$OUT/throughput_new_$CARD.json"
  # run 1: the mixed steps are host-bound (host ~ GPU time per layer); where the host's time goes, by function
  fits 60 && run mix_long32k_pyprof 100 python3 benchmarks/bench_prefill.py --steps 4 --fp8-size 2048 \
    --layers window,window+engram,r2-full,r2-reuse --mix 1x3584@32768,8x64@64 --py-profile 60 \
    --out "$OUT/mix_long32k_pyprof_$CARD.json"
  # run 1 had the 32k mix at 37.9 (base) against 43.1 ms (new), every host stage ~20% slower in the second run,
  # the indexer's own host time lower: once more in the other order
  mix_sides mix_long32k_again 1x3584@32768,8x64@64 window,window+engram,r2-full,r2-reuse "new base"
  cat "$OUT/summary.txt"
  grep -hE "pass [0-9]" "$OUT"/throughput_*.txt | cut -c1-260
  grep -hE "step as run|timed step" "$OUT"/mix_*.txt
  ;;
esac
pack_out
