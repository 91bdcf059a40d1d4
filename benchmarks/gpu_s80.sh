#!/usr/bin/env bash
# Session 80's GPU calls.
#   PART=owed (~300 s on a fresh H100): what session 79 left unrun. The GPU tests its review edited (Engram kernels,
#       hyper-connections, RMSNorm: their bf16 check moved to kernel_devices; the reference's Engram rows on
#       act_dequant), then session 79's decode A/B in CUDA graphs (bench_decode, medium, window, window+engram and
#       ratio-1 FULL layers, batch 32 / 64 at 131,072 tokens; base 4a72572 from .ab-base.tar.gz), then the runtime's
#       core GPU tests in the time left.
#   PART=seqs (~500 s): the general forward's per-sequence loops as whole-step operations (model.StepRows). The
#       runtime's core GPU tests (the model and the engine against the reference, CUDA-graph decode, the forward
#       under CUDA's sync debug mode), then bench_prefill on main before it (mid, .ab-mid.tar.gz of cd8398e) and the
#       tree, four real-width layers (window, window+engram, ratio-2 FULL and REUSE), 4,096 tokens per step: 64 fresh
#       prompts of 64 tokens, one sequence at 131,072 (the official workload, for regressions), session 79's kernel
#       tests, and 16 sequences of 256 at 8,192 tokens of context, as the deadline allows.
# `git archive -o .ab-base.tar.gz 4a72572 packages/*/src runtime/src benchmarks` (its own bench_decode: the tree's
# calls V41Cache.reset_slots, which 4a72572 lacks); `git archive -o .ab-mid.tar.gz cd8398e packages/*/src
# runtime/src`; carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=owed bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s80
case "${PART:-owed}" in
owed)
  run kernel_tests 90 $PYTEST runtime/tests/test_engram_kernels.py runtime/tests/test_hyper_connections.py \
    runtime/tests/test_rmsnorm.py --junitxml="$OUT/junit_kernels.xml"
  for side in base new; do
    script=benchmarks/bench_decode.py; [ $side = base ] && script=/tmp/ab-base/benchmarks/bench_decode.py
    run "decode2_$side" 110 env PYTHONPATH="$(side_path $side)" python3 $script --preset medium \
      --layers window,window+engram,r1-full --batches 32,64 --contexts 131072 --kv-cache-gb 8 --profile \
      --out "$OUT/decode2_${side}_$CARD.json"
  done
  fits 60 && runtime_core_tests $((${DEADLINE:-540} - SECONDS - 15))
  cat "$OUT/summary.txt"; test_summary kernel_tests runtime_tests
  grep -hE "graphs=1|engram " "$OUT"/decode2_*.txt | cut -c1-200
  ;;
seqs)
  runtime_core_tests 150
  layers=(--layers window,window+engram,r2-full,r2-reuse --tokens 4096 --steps 4 --fp8-size 2048)
  prefill_pair() {  # SEQS CONTEXT [ARGS...]: bench_prefill on mid and new
    local n=$1 ctx=$2 side; shift 2
    for side in mid new; do
      fits 50 && run "prefill_s${n}_$side" 100 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
        "${layers[@]}" --seqs $n --context $ctx "$@" --out "$OUT/prefill_s${n}_${side}_$CARD.json"
    done
  }
  prefill_pair 64 64
  prefill_pair 1 131072 --no-profile
  fits 120 && run kernel_tests 100 $PYTEST runtime/tests/test_engram_kernels.py \
    runtime/tests/test_hyper_connections.py runtime/tests/test_rmsnorm.py --junitxml="$OUT/junit_kernels.xml"
  prefill_pair 16 8192 --no-profile
  cat "$OUT/summary.txt"; test_summary kernel_tests runtime_tests
  grep -hE "^ +[0-9]+ (window|r2)|step as run|tokens .* in " "$OUT"/prefill_*.txt | cut -c1-160
  ;;
esac
pack_out
