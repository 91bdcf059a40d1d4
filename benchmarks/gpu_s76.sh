#!/usr/bin/env bash
# Session 76's GPU call: what session 75 owed on the Triton route (MINI_DEEPGEMM_GLUON=0) before the FP8-MMA MoE
# kernel's switch (MINI_DEEPGEMM_TRITON_FP8_MOE) can be turned on by default, and the evidence for the Triton
# attention kernel's decode split rule. In order, so that a short call still answers the first question:
# bench_decode with the switch off and on (medium model, batch 32 / 64 at 131,072 tokens), the runtime's core GPU
# tests with the switch on, bench_flashmla's decode part (the Gluon and Triton kernels' split sweeps), and, as time
# allows, exp_moe_triton_fp8.py (session 75's sweep was cut after three rows) (~540 s).
# carry [".devdeps"]; source .devdeps/env.sh && DEADLINE=N bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s76
export MINI_DEEPGEMM_GLUON=0
for switch in 0 1; do
  fits 90 && decode_bench "decode_triton_fp8moe$switch" env MINI_DEEPGEMM_TRITON_FP8_MOE=$switch
done
fits 100 && (export MINI_DEEPGEMM_TRITON_FP8_MOE=1; runtime_core_tests 150)
fits 60 && run flashmla_decode_triton 120 env BENCH_PARTS=decode OUT="$OUT" BENCH_JSON=flashmla_decode_triton.json \
  bash -c "cd benchmarks && python3 bench_flashmla.py"
fits 60 && run exp_moe_triton_fp8 $((${DEADLINE:-540} - SECONDS - 15)) env OUT="$OUT" \
  bash -c "cd benchmarks && python3 exp_moe_triton_fp8.py"
cat "$OUT/summary.txt"; test_summary runtime_tests
grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
grep -hE "^\| decode" "$OUT/flashmla_decode_triton.txt" 2>/dev/null | cut -c1-300
grep -h "^| " "$OUT/exp_moe_triton_fp8.txt" 2>/dev/null | cut -c1-600
pack_out
