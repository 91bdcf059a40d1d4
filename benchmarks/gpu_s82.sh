#!/usr/bin/env bash
# Session 82's GPU calls.
#   PART=bench (~450 s on a fresh H100 or H200): session 81's owed mixed step and the engine end to end.
#       bench_prefill --mix on session 80's final tree (base, 917e97f: the indexer per sequence) and this one (the
#       indexer in groups by publisher and entry bucket), four real-width layers (window, window+engram, ratio-2 FULL,
#       REUSE), then the ratio-1 FULL + REINDEX pair: one sequence's 2,048-token chunk at 131,072 of context beside 32
#       fresh 64-token prompts, and a 3,584-token chunk at 32,768 beside 8 fresh 64-token prompts. Then
#       bench_throughput (medium model, 256 requests of 100-1,024 prompt and 100-1,024 output tokens, one warm-up and
#       two timed passes) on cd8398e (mid, before session 80), base and this tree.
# `git archive -o .ab-base.tar.gz 917e97f packages/*/src runtime/src`; `git archive -o .ab-mid.tar.gz cd8398e
# packages/*/src runtime/src`; carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=bench bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s82
case "${PART:-bench}" in
bench)
  mix_sides() {  # NAME MIX LAYERS SIDES: bench_prefill --mix on each side
    local name=$1 mix=$2 which=$3 sides=$4 side
    for side in $sides; do
      fits 50 && run "${name}_$side" 100 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        --steps 4 --fp8-size 2048 --layers "$which" --mix "$mix" --out "$OUT/${name}_${side}_$CARD.json"
    done
  }
  four=window,window+engram,r2-full,r2-reuse
  mix_sides mix_long131k 1x2048@131072,32x64@64 $four "base new"
  mix_sides mix_long32k 1x3584@32768,8x64@64 $four "base new"
  mix_sides mix_long131k_r1 1x2048@131072,32x64@64 r1-full,r1-reindex "base new"
  for side in new mid base; do
    fits 60 && run "throughput_$side" 150 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_throughput.py \
      --preset medium --out "$OUT/throughput_${side}_$CARD.json"
  done
  cat "$OUT/summary.txt"
  grep -hE "^ +[0-9]+ (window|r[12])|step as run|tokens .* in " "$OUT"/mix_*.txt | cut -c1-160
  grep -hE "pass [0-9]" "$OUT"/throughput_*.txt | cut -c1-260
  ;;
esac
pack_out
