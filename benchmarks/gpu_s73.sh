#!/usr/bin/env bash
# Session 73's GPU runs: what session 72 owed for the Triton route (MINI_DEEPGEMM_GLUON=0, the route a uv-locked
# install or a non-Hopper GPU takes; docs/reports/triton-route-on-hopper.md), end to end and in the suites.
#   PART=owed (~500 s): part B of the rest of the runtime suite on the Triton route, then bench_prefill (seven sample
#       layers on an H200, three on an H100) on each route.
#   PART=decode (~300 s): bench_decode (medium model, batch 32 / 64 at 131,072 tokens) on each route, then
#       bench_flashmla's decode part on the Triton route (its split counts, as that route takes them).
#   PART=moe (~500 s): the Triton route's FP8-MMA MoE kernel (gemm_fp4_e4m3_kernel.py): its tests and the Gluon
#       route's FP8-MMA tests (their PTX constants now come from that module), exp_moe_triton_fp8.py on the Triton
#       route (tile sweep, the bf16-MMA route it replaces and the Gluon kernels in one process), bench_prefill on the
#       Triton route before (base: .ab-base.tar.gz of a15b70f) and after, then the runtime's core GPU tests on the
#       Triton route. The kernel's switch MINI_DEEPGEMM_TRITON_FP8_MOE=1 is on for those (off by default since run 2;
#       run 1 ran the tree before the switch existed, where the route was on).
# carry [".devdeps"] (PART=moe: and ".ab-base.tar.gz"); source .devdeps/env.sh && DEADLINE=N PART=owed bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s73
# gluon ROUTE: MINI_DEEPGEMM_GLUON's value for a route: 1 (the release's rule) for gluon, 0 for triton
gluon() { if [ "$1" = triton ]; then echo 0; else echo 1; fi; }
case "${PART:-owed}" in
moe)
  run fp4_e4m3_tests 100 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3_triton.py \
    packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py -m gpu --junitxml="$OUT/junit_fp4_e4m3.xml"
  run exp_moe_triton_fp8 150 env MINI_DEEPGEMM_GLUON=0 OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_triton_fp8.py"
  for side in base new; do
    fits 120 && run "prefill_triton_$side" 115 env MINI_DEEPGEMM_GLUON=0 MINI_DEEPGEMM_TRITON_FP8_MOE=1 \
      PYTHONPATH="$(side_path $side)" \
      python3 benchmarks/bench_prefill.py "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_triton_${side}_$CARD.json"
  done
  fits 100 && (export MINI_DEEPGEMM_GLUON=0 MINI_DEEPGEMM_TRITON_FP8_MOE=1
    runtime_core_tests $((${DEADLINE:-540} - SECONDS - 10)))
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
  grep -h "^| " "$OUT/exp_moe_triton_fp8.txt" | cut -c1-400
  grep -hE "tok/s|moe|attention" "$OUT"/prefill_*.txt 2>/dev/null | cut -c1-200
  ;;
owed)
  (export MINI_DEEPGEMM_GLUON=0; rest_b 250)
  for route in triton gluon; do
    fits 120 && run "prefill_$route" 115 env MINI_DEEPGEMM_GLUON="$(gluon $route)" python3 benchmarks/bench_prefill.py \
      "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_${route}_$CARD.json"
  done
  cat "$OUT/summary.txt"
  grep -hE "tok/s|attention|moe" "$OUT"/prefill_*.txt 2>/dev/null | cut -c1-200
  ;;
decode)
  for route in triton gluon; do
    fits 125 && decode_bench "decode_$route" env MINI_DEEPGEMM_GLUON="$(gluon $route)"
  done
  fits 60 && run flashmla_decode_triton 55 env MINI_DEEPGEMM_GLUON=0 BENCH_PARTS=decode OUT="$OUT" \
    BENCH_JSON=flashmla_decode_triton.json bash -c "cd benchmarks && python3 bench_flashmla.py"
  cat "$OUT/summary.txt"
  grep -hE "tok/s|graphs=1|^stage" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200 | head -40
  grep -hE "^\| decode" "$OUT/flashmla_decode_triton.txt" 2>/dev/null | cut -c1-160
  ;;
esac
pack_out
