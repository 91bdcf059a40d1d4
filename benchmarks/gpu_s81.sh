#!/usr/bin/env bash
# Session 81's GPU calls (written while no device was lent; run 1 = PART=indexer, run 2 = PART=owed, on one H100;
# runs 3-5, the GPU suites, are commands in docs/reports/gpu-session-2026-12-07-s81.md).
#   PART=indexer (~500 s on a fresh H100 or H200): the general forward's indexer over groups of sequences
#       (model._indexer, mini_flashmla's ragged indexer_scores). The ragged kernels against each sequence alone, bit
#       for bit (test_indexer_ragged.py, and the indexer kernel tests), the runtime's indexer against the per-sequence
#       loop on CUDA (test_step_rows.py) with session 80's owed core tests (the model and the engine against the
#       reference, CUDA-graph decode, the prefill under CUDA's sync debug mode), then bench_prefill on session 80's
#       final tree (base, 917e97f) and this one, four real-width layers (window, window+engram, ratio-2 FULL, REUSE),
#       4,096 tokens per step: 64 fresh prompts of 64 tokens, 16 sequences of 256 at 8,192 of context, and one
#       sequence at 131,072 (the official workload) on cd8398e (mid, before session 80) too, then the ratio-1 FULL
#       and REINDEX layers (the candidate path) at 64 x 64 as the deadline allows.
#   PART=owed (~400 s): session 79's decode A/B in CUDA graphs (bench_decode, medium, window, window+engram and
#       ratio-1 FULL layers, batch 32 / 64 at 131,072 tokens; alt = 4a72572 with its own bench_decode), then the
#       one-sequence prefill step twice more on base and new, alternating.
# `git archive -o .ab-base.tar.gz 917e97f packages/*/src runtime/src`; `git archive -o .ab-mid.tar.gz cd8398e
# packages/*/src runtime/src`; `git archive -o .ab-alt.tar.gz 4a72572 packages/*/src runtime/src benchmarks`; carry
# [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz", ".ab-alt.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=indexer bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s81
case "${PART:-indexer}" in
indexer)
  run kernel_tests 120 $PYTEST packages/mini-flashmla/tests/test_indexer_ragged.py \
    packages/mini-flashmla/tests/test_kernels.py -k "indexer or ragged or candidate" --junitxml="$OUT/junit_kernels.xml"
  RUNTIME_CORE_TESTS="$RUNTIME_CORE_TESTS runtime/tests/test_step_rows.py" runtime_core_tests 170
  layers=(--tokens 4096 --steps 4 --fp8-size 2048)
  prefill_sides() {  # NAME SEQS CONTEXT LAYERS SIDES [ARGS...]: bench_prefill on each side
    local name=$1 n=$2 ctx=$3 which=$4 sides=$5 side; shift 5
    for side in $sides; do
      fits 50 && run "${name}_$side" 100 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        "${layers[@]}" --layers "$which" --seqs "$n" --context "$ctx" "$@" --out "$OUT/${name}_${side}_$CARD.json"
    done
  }
  four=window,window+engram,r2-full,r2-reuse
  prefill_sides prefill_s64 64 64 $four "base new"
  prefill_sides prefill_s16 16 8192 $four "base new" --no-profile
  prefill_sides prefill_s1 1 131072 $four "mid base new" --no-profile
  prefill_sides prefill_s64_r1 64 64 r1-full,r1-reindex "base new"
  cat "$OUT/summary.txt"; test_summary kernel_tests runtime_tests
  grep -hE "^ +[0-9]+ (window|r[12])|step as run|tokens .* in " "$OUT"/prefill_*.txt | cut -c1-160
  ;;
owed)
  for side in alt new; do
    script=benchmarks/bench_decode.py; [ $side = alt ] && script=/tmp/ab-alt/benchmarks/bench_decode.py
    run "decode2_$side" 110 env PYTHONPATH="$(side_path $side)" python3 $script --preset medium \
      --layers window,window+engram,r1-full --batches 32,64 --contexts 131072 --kv-cache-gb 8 --profile \
      --out "$OUT/decode2_${side}_$CARD.json"
  done
  # run 1 had the one-sequence step at 39.5 (base) against 40.3 ms (new): twice more each, alternating
  for i in 1 2; do
    for side in base new; do
      fits 40 && run "prefill_s1_${side}_$i" 60 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        --tokens 4096 --steps 4 --fp8-size 2048 --layers window,window+engram,r2-full,r2-reuse --seqs 1 \
        --context 131072 --no-profile --out "$OUT/prefill_s1_${side}_${i}_$CARD.json"
    done
  done
  cat "$OUT/summary.txt"
  grep -hE "graphs=1|engram " "$OUT"/decode2_*.txt | cut -c1-200
  grep -hE "step as run" "$OUT"/prefill_s1_*.txt
  ;;
esac
pack_out
