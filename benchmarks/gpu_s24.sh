#!/usr/bin/env bash
# Session 24's GPU runs (docs/reports/gpu-session-2026-12-02-s24.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s24.sh   (1 x H200, tree = main + the persistent attention
#       kernel (3e180de), baseline = main's src folders in .ab-base.tar.gz: the mini-flashmla GPU tests on the tree;
#       bench_flashmla (prefill, decode) and bench_prefill on both; exp_flashmla_seesaw.py on main's kernel module)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s24.sh   (1 x H200, tree = branch masked-order (token tiles
#       first in the grid, then two converted tiles), .ab-mid.tar.gz = its first commit, .ab-base.tar.gz = main: the
#       mini-deepgemm and the runtime's core GPU tests on the tree; bench_fp4_e4m3_route on the three;
#       exp_moe_masked_tiles on tree and mid; bench_decode on tree and base)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s24.sh   (1 x H200, tree = main with the masked kernel's grid
#       order and the attention consumers in turns, .ab-base.tar.gz = main before the session: the mini-flashmla GPU
#       tests, the FP8-MMA route's GPU tests, the runtime's core GPU tests; bench_flashmla, bench_prefill and
#       bench_decode on both; the attention breakdown and Nsight Compute on both prefill cases, tree)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s24.sh   (1 x H200, tree = main with the masked kernel on 4
#       or 8 warps, .ab-base.tar.gz = main (run 3's tree): the FP8-MMA route's GPU tests, exp_moe_masked_tiles and
#       bench_fp4_e4m3_route on the tree, bench_fp4_e4m3_route on main, the runtime's core GPU tests and both parts of
#       the rest)
# (exp_flashmla_seesaw.py, which run 1 ran, was removed when the kernel took its design: git show
# b71ef74:benchmarks/exp_flashmla_seesaw.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s24
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 60 new base
  run seesaw 200 env PYTHONPATH="$BASE_PYTHONPATH" bash -c "cd benchmarks && python3 exp_flashmla_seesaw.py"
  prefill_sides 70 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new base
  tail -30 "$OUT/seesaw.txt" | cut -c1-250
  ;;
r2)
  run deepgemm_tests 150 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  for side in new mid base; do
    run "route_$side" 60 env PYTHONPATH="$(side_path $side)" bash -c "cd benchmarks && python3 bench_fp4_e4m3_route.py"
  done
  for side in new mid; do
    run "tiles_$side" 90 env PYTHONPATH="$(side_path $side)" bash -c "cd benchmarks && python3 exp_moe_masked_tiles.py"
  done
  decode_bench decode_new env
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for side in new mid base; do echo "== route $side"; grep -E "^\| masked|^\| contiguous" "$OUT/route_$side.txt" | cut -c1-160; done
  for side in new mid; do echo "== tiles $side"; grep -E "^\| ~" "$OUT/tiles_$side.txt"; done
  for side in new base; do echo "== decode $side"; grep -E "graphs=1" "$OUT/decode_$side.txt" | cut -c1-200; done
  ;;
r3)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run route_tests 60 $PYTEST packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  flashmla_sides 60 new base
  run breakdown 60 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  prefill_sides 70 new base
  decode_bench decode_new env
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  ncu_profile sparse_prefill_bf16 sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests route_tests runtime_tests
  show_sides new base
  for side in new base; do echo "== decode $side"; grep -E "graphs=1" "$OUT/decode_$side.txt" | cut -c1-200; done
  tail -14 "$OUT/breakdown.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -24
  ;;
r4)
  run route_tests 60 $PYTEST packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py -m gpu
  run tiles_new 90 bash -c "cd benchmarks && python3 exp_moe_masked_tiles.py"
  for side in new base; do
    run "route_$side" 50 env PYTHONPATH="$(side_path $side)" bash -c "cd benchmarks && python3 bench_fp4_e4m3_route.py"
  done
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  rest_ab 80 110
  cat "$OUT/summary.txt"; test_summary route_tests runtime_tests runtime_rest_a runtime_rest_b
  grep -E "^\| ~" "$OUT/tiles_new.txt"
  for side in new base; do echo "== route $side"; grep -E "^\| masked" "$OUT/route_$side.txt" | cut -c1-120; done
  ;;
esac
pack_out
