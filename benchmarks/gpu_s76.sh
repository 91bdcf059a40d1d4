#!/usr/bin/env bash
# Session 76's GPU calls, all on the Triton route (MINI_DEEPGEMM_GLUON=0).
#   PART=attn (~540 s): the Triton attention kernel with its two sources walked in one loop (one copy of the softmax
#       and the MMAs; triton 3.6 spilled 768 B per thread with two loops, 280 B with one), base = main before it
#       (.ab-base.tar.gz): attn_output_hash.py on each side (the same bits?), bench_flashmla's prefill and decode parts
#       on each side (the decode part sweeps both kernels' split counts: the Triton split rule's evidence), then
#       what session 75 owed: bench_decode (medium model, batch 32 / 64 at 131,072 tokens) with the FP8-MMA MoE
#       kernel's switch MINI_DEEPGEMM_TRITON_FP8_MOE off and on.
#   PART=tests (~230 s): mini-flashmla's GPU suite and the runtime's core GPU tests with the switch on.
#   PART=split (~480 s): one decode split rule for both attention kernels, base = main before it (.ab-base.tar.gz):
#       bench_flashmla's decode part and bench_decode with the switch on, on each side; mini-flashmla's GPU suite.
#   PART=default (~300 s): the switch on by default (no MINI_DEEPGEMM_TRITON_FP8_MOE set): mini-deepgemm's GPU suite
#       and the runtime's core GPU tests.
# PART=attn and PART=split: `git archive -o .ab-base.tar.gz REV packages/*/src runtime/src`;
# carry [".devdeps", ".ab-base.tar.gz"]
# source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s76
export MINI_DEEPGEMM_GLUON=0
case "${PART:-attn}" in
attn)
  hash_sides base new
  flashmla_sides 150 base new  # ~100 s a side on an H100 since session 75's Triton split sweep
  for switch in 0 1; do
    fits 90 && decode_bench "decode_triton_fp8moe$switch" env MINI_DEEPGEMM_TRITON_FP8_MOE=$switch
  done
  cat "$OUT/summary.txt"; cat "$OUT"/hash_*.txt
  for side in base new; do
    echo "== $side"; grep -hE "^\| (prefill_(paged|bf16)_tflops|decode)" "$OUT/flashmla_$side.txt" | cut -c1-300
  done
  grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
  ;;
tests)
  flashmla_tests 170
  fits 100 && (export MINI_DEEPGEMM_TRITON_FP8_MOE=1; runtime_core_tests 150)
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  ;;
split)
  decode_parts 110 base new
  for side in base new; do
    fits 100 && decode_bench "decode_fp8moe1_$side" env MINI_DEEPGEMM_TRITON_FP8_MOE=1 PYTHONPATH="$(side_path $side)"
  done
  fits 120 && flashmla_tests 170
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  for side in base new; do echo "== $side"; grep -hE "^\| decode" "$OUT/decode_part_$side.txt" | cut -c1-300; done
  grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
  ;;
default)
  unset MINI_DEEPGEMM_TRITON_FP8_MOE
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  fits 100 && runtime_core_tests 150
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  ;;
esac
pack_out
