#!/usr/bin/env bash
# Session 72's GPU runs: the Triton route on Hopper. MINI_DEEPGEMM_GLUON=0 turns the Gluon kernels off, so every call
# takes the route a uv-locked install (triton 3.9) or a GPU other than Hopper takes; here it runs on the machine's
# triton 3.6 (docs/reports/triton-route-on-hopper.md).
#   PART=tests (run 1, 255 s on a cold H200): on the Triton route, mini-deepgemm's GPU suite, mini-flashmla's, the
#       runtime's core GPU tests and the offline example; then bench_flashmla on each route where time allows.
#   PART=gluon_suites (run 2, 182 s warm): the same three suites on the Gluon route (the first H200 run since session
#       66), and bench_fp4_e4m3_route.py (the engine's folded MoE route and its peer).
#   PART=gemm (run 3, 69 s warm): bench_deepgemm (M = 4,096, CUDA-graph replay) on each route.
#   PART=rest_a (run 4, 52 s warm): part A of the rest of the runtime suite on the Triton route.
#   PART=owed (not run in session 72: no device time left): part B of the rest on the Triton route, then bench_prefill
#       (three sample layers on an H100, seven on an H200) on each route.
# Runs 2-4 ran as inline commands on the warm H200 of run 1 (the session log quotes them); these parts are the same.
# carry [".devdeps"]; source .devdeps/env.sh && DEADLINE=N PART=tests bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s72
# gluon ROUTE: MINI_DEEPGEMM_GLUON's value for a route, for `env`: 1 (the release's rule) for gluon, 0 for triton
gluon() { if [ "$1" = triton ]; then echo 0; else echo 1; fi; }
route_check() {
  for route in gluon triton; do
    env MINI_DEEPGEMM_GLUON="$(gluon $route)" python3 -c "import torch; from mini_deepgemm import _backend as b; \
print('$route: gluon_runs_on', b.gluon_runs_on(torch.empty(1, device='cuda')))"
  done | tee "$OUT/route_check.txt"
}
# flashmla_routes: bench_flashmla (prefill, decode) on each route where time allows (its decode part times the Gluon
# kernel and the Triton kernel in one process on either route), into $OUT/flashmla_ROUTE.{txt,json}
flashmla_routes() {
  for route in triton gluon; do
    fits 60 && run "flashmla_$route" 55 env MINI_DEEPGEMM_GLUON="$(gluon $route)" BENCH_PARTS=prefill,decode \
      OUT="$OUT" BENCH_JSON="flashmla_$route.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
}
# show_routes: each route's benchmark rows that ran
show_routes() {
  for route in gluon triton; do
    echo "== $route"
    grep -hE "^\| (prefill|decode)" "$OUT/flashmla_$route.txt" 2>/dev/null | cut -c1-110
    grep -hE "^\|" "$OUT/deepgemm_$route.txt" 2>/dev/null | cut -c1-160 | tail -16
    grep -hE "tok/s|attention|moe" "$OUT/prefill_$route.txt" 2>/dev/null | cut -c1-200 | head -6
  done
}
case "${PART:-tests}" in
tests)
  route_check
  export MINI_DEEPGEMM_GLUON=0
  run deepgemm_tests 170 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  fits 150 && flashmla_tests 140
  fits 140 && runtime_core_tests 130
  fits 50 && run offline_example 45 python3 runtime/examples/offline_inference.py
  flashmla_routes
  cat "$OUT/summary.txt"; tail -4 "$OUT/offline_example.txt" 2>/dev/null
  test_summary deepgemm_tests flashmla_tests runtime_tests
  show_routes
  ;;
gluon_suites)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests -m gpu --junitxml="$OUT/junit_deepgemm.xml"
  fits 60 && flashmla_tests 60
  fits 60 && runtime_core_tests 60
  fits 70 && route_sides 65 new
  cat "$OUT/summary.txt"; test_summary deepgemm_tests flashmla_tests runtime_tests
  grep -h "^| contiguous\|^| masked" "$OUT"/route_*.txt
  ;;
gemm)
  for route in triton gluon; do
    fits 105 && run "deepgemm_$route" 100 env MINI_DEEPGEMM_GLUON="$(gluon $route)" \
      python3 benchmarks/bench_deepgemm.py --graph --m 4096 --out "$OUT/deepgemm_$route"
  done
  cat "$OUT/summary.txt"; show_routes
  ;;
rest_a)
  export MINI_DEEPGEMM_GLUON=0
  run runtime_rest_a 130 $PYTEST $RUNTIME_REST_A -m "not multigpu" -n 16 --junitxml="$OUT/junit_rest_a.xml"
  cat "$OUT/summary.txt"; test_summary runtime_rest_a
  ;;
owed)
  MINI_DEEPGEMM_GLUON=0 rest_b 250
  for route in triton gluon; do
    fits 120 && run "prefill_$route" 115 env MINI_DEEPGEMM_GLUON="$(gluon $route)" python3 benchmarks/bench_prefill.py \
      "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_${route}_$CARD.json"
  done
  cat "$OUT/summary.txt"; show_routes
  ;;
esac
pack_out
