#!/usr/bin/env bash
# Session 75's second GPU call: the Triton route's FP8-MMA MoE kernel (gemm_fp4_e4m3_kernel.py) on the tiles run 1's
# sweep chose (swap-AB form only; the D = X W^T form and late promotion removed), all with MINI_DEEPGEMM_GLUON=0:
# its GPU tests, bench_prefill before (base: .ab-base.tar.gz of a15b70f, the bf16-MMA route) and after with the
# kernel's switch MINI_DEEPGEMM_TRITON_FP8_MOE=1, bench_flashmla's decode part (now with the Triton kernel's split
# counts swept, as the Gluon kernel's), exp_moe_triton_fp8.py (the new tile list), bench_decode on the tree
# with the switch off and on, then the runtime's core GPU tests with the switch, as time allows (~420 s; in that order
# so that a short call still answers whether the prefill step gains).
# carry [".devdeps", ".ab-base.tar.gz"]; source .devdeps/env.sh && DEADLINE=N bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s75
export MINI_DEEPGEMM_GLUON=0
run fp4_e4m3_tests 60 env MINI_DEEPGEMM_TRITON_FP8_MOE=1 $PYTEST -n 8 \
  packages/mini-deepgemm/tests/test_gemm_fp4_e4m3_triton.py -m gpu --junitxml="$OUT/junit_fp4_e4m3.xml"
for side in base new; do
  fits 70 && run "prefill_triton_$side" 90 env MINI_DEEPGEMM_TRITON_FP8_MOE=1 PYTHONPATH="$(side_path $side)" \
    python3 benchmarks/bench_prefill.py "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_triton_${side}_$CARD.json"
done
fits 130 && run flashmla_decode_triton 120 env BENCH_PARTS=decode OUT="$OUT" BENCH_JSON=flashmla_decode_triton.json \
  bash -c "cd benchmarks && python3 bench_flashmla.py"
sweep_secs=$((${DEADLINE:-540} - SECONDS - 15)); [ "$sweep_secs" -gt 130 ] && sweep_secs=130
fits 60 && run exp_moe_triton_fp8 "$sweep_secs" env OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_triton_fp8.py"
for switch in 0 1; do
  fits 90 && decode_bench "decode_triton_fp8moe$switch" env MINI_DEEPGEMM_TRITON_FP8_MOE=$switch
done
fits 90 && (export MINI_DEEPGEMM_TRITON_FP8_MOE=1; runtime_core_tests $((${DEADLINE:-540} - SECONDS - 10)))
cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
grep -h "^| " "$OUT/exp_moe_triton_fp8.txt" | cut -c1-600
grep -hE "tok/s|moe experts" "$OUT"/prefill_*.txt 2>/dev/null | cut -c1-200
grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
grep -hE "^\| decode" "$OUT/flashmla_decode_triton.txt" 2>/dev/null | cut -c1-300
pack_out
