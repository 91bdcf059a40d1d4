#!/usr/bin/env bash
# Session 79's GPU calls: the Engram injection with the stored table rows straight into wkv and the gate fused
# (runtime/src/mini_deepinfer/layers/engram_kernels.py), against main before it (.ab-base.tar.gz of 4a72572).
#   PART=engram (~300 s on a fresh H100): the Engram tests (test_engram_kernels.py, the kernels' sm_90 compile cases
#       under the machine's triton), bench_engram.py on the tree (before / after composed in one process),
#       bench_prefill with the window and window+engram sample layers on each side (the 40-layer step's Engram term
#       and its profiled stage), bench_decode (medium, the same two layers, batch 32 / 64 at 131,072 tokens, CUDA
#       graphs) on each side, then the runtime's core GPU tests (the model and the engine against the reference: the
#       tiny model has Engram layers 1 and 3; decode with CUDA graphs) in the time left. Run 1 ran it with the gate
#       kernel only (the operand by torch ops; the test file then test_engram_gate.py).
#   PART=decode (~480 s): bench_decode (medium; window, window+engram and ratio-2 FULL layers, batch 32 / 64 at
#       131,072 tokens, CUDA graphs, --profile) on each side; the window-only model (window, window+engram), which
#       the cache plan divided by zero on before this session; the rest of the runtime's GPU suite (parts A and B).
#       Run 3 ran it: with no ratio-1 FULL layer the decode publisher depends on the position, so decode took the
#       general path (no CUDA graphs, the Engram row ids hashed per sequence) on both sides, as does the window-only
#       model (any model without a FULL layer).
#   PART=decode2 (~230 s): the Engram and hyper-connection GPU tests on the reviewed tree (their bf16 check moved to
#       kernel_devices), then bench_decode on each side with window, window+engram and ratio-1 FULL layers, whose
#       decode runs decode_forward in CUDA graphs as the real model's does.
#   PART=step (~450 s, an H200 only: the seven sample layers do not fit an H100): bench_prefill's whole 40-layer step
#       on each side, base first.
# `git archive -o .ab-base.tar.gz 4a72572 packages/*/src runtime/src`; carry [".devdeps", ".ab-base.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N PART=engram bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s79
case "${PART:-engram}" in
engram)
  run engram_tests 120 $PYTEST runtime/tests/test_engram_kernels.py integration_tests/test_compile_sm90_runtime.py \
    -k "engram" --junitxml="$OUT/junit_engram.xml"
  run bench_engram 120 python3 benchmarks/bench_engram.py --out "$OUT/bench_engram_$CARD.json"
  for side in base new; do
    fits 100 && run "prefill_$side" 150 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      --tokens 4096 --layers window,window+engram --out "$OUT/prefill_${side}_$CARD.json"
  done
  fits 60 && runtime_core_tests $((${DEADLINE:-540} - SECONDS - 15))
  cat "$OUT/summary.txt"; test_summary engram_tests runtime_tests
  grep -h "^| \|^|--" "$OUT/bench_engram.txt"
  grep -hE "window|engram" "$OUT"/prefill_*.txt | cut -c1-200
  ;;
decode)
  for side in base new; do
    run "decode_$side" 150 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      --layers window,window+engram,r2-full --batches 32,64 --contexts 131072 --kv-cache-gb 8 --profile \
      --out "$OUT/decode_${side}_$CARD.json"
  done
  run decode_window_only 120 python3 benchmarks/bench_decode.py --preset medium --layers window,window+engram \
    --batches 32,64 --contexts 131072 --kv-cache-gb 8 --out "$OUT/decode_window_only_$CARD.json"
  fits 150 && rest_ab 90 $((${DEADLINE:-540} - SECONDS - 110))
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  grep -hE "graphs|engram" "$OUT"/decode_*.txt | cut -c1-200
  ;;
decode2)
  run kernel_tests 60 $PYTEST runtime/tests/test_engram_kernels.py runtime/tests/test_hyper_connections.py \
    --junitxml="$OUT/junit_kernels.xml"
  for side in base new; do
    run "decode2_$side" 110 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      --layers window,window+engram,r1-full --batches 32,64 --contexts 131072 --kv-cache-gb 8 \
      --out "$OUT/decode2_${side}_$CARD.json"
  done
  cat "$OUT/summary.txt"; test_summary kernel_tests
  grep -hE "graphs=1" "$OUT"/decode2_*.txt | cut -c1-200
  ;;
step)
  [ "$CARD" = h200 ] || { echo "not an H200 ($CARD): the whole step does not fit"; exit 3; }
  prefill_sides 220 base new
  cat "$OUT/summary.txt"
  grep -hE "40-layer|window|engram" "$OUT"/prefill_*.txt | cut -c1-200
  ;;
esac
pack_out
