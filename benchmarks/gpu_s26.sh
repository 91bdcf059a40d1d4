#!/usr/bin/env bash
# Session 26's GPU runs (docs/reports/gpu-session-2026-12-02-s26.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s26.sh   (1 x H200, tree = main with the register-A folded
#       masked MoE kernel (036dd28 cherry-picked), .ab-base.tar.gz = main before the session (ed2f5f3): the
#       mini-deepgemm GPU suite and the runtime's core GPU tests on the tree; bench_fp4_e4m3_route and bench_decode on
#       both; exp_moe_masked_rega.py)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s26.sh   (1 x H200, tree = main with the Gluon kernel's split
#       decode, .ab-base.tar.gz = 94266de (run 1's tree: the register-A masked kernel, decode unsplit on Gluon): the
#       mini-flashmla GPU suite and the runtime's core GPU tests on the tree; bench_flashmla on the tree (prefill and
#       decode: the split against both kernels' earlier routes in one process); bench_decode and bench_prefill on both;
#       parts A and B of the rest of the runtime's GPU suite on the tree)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s26.sh   (1 x H200, tree = main after the review (one folded
#       masked K loop, SASS identical offline): the mini-deepgemm GPU suite; bench_flashmla's decode with the merge
#       timed alone; Nsight Compute of the batch-64 decode call (split kernel and merge))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s26.sh   (1 x H200, tree = main with the merge cut along the
#       head dim (4x its programs): the mini-flashmla GPU suite and the runtime's core GPU tests; bench_flashmla's
#       decode (the merge alone against run 3's 4.6 / 5.0 / 5.2 us))
# (exp_moe_masked_rega.py, which run 1 ran, was removed when the package took its natural-order kernel in session
# 26: git show 31d70c7:benchmarks/exp_moe_masked_rega.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s26
case "${PART:-r1}" in
r1)
  run deepgemm_tests 160 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  route_sides 90 new base
  run rega 100 bash -c "cd benchmarks && python3 exp_moe_masked_rega.py"
  decode_bench decode_new
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for s in new base; do echo "== route $s"; grep -E "^\| " "$OUT/route_$s.txt" | cut -c1-200; done
  tail -12 "$OUT/rega.txt" | cut -c1-250
  for s in new base; do echo "== decode $s"; grep -E "ms/step|bench_decode:" "$OUT/decode_$s.txt" | cut -c1-200; done
  ;;
r2)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  flashmla_sides 110 new
  decode_bench decode_new
  decode_bench decode_base env PYTHONPATH="$BASE_PYTHONPATH"
  prefill_sides 70 new base
  rest_ab 90 130
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests runtime_rest_a runtime_rest_b
  show_sides new base
  for s in new base; do echo "== decode $s"; grep -E "ms/step|bench_decode:" "$OUT/decode_$s.txt" | cut -c1-200; done
  ;;
r3)
  run deepgemm_tests 160 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run flashmla_decode 90 env BENCH_PARTS=decode BENCH_JSON=flashmla_decode.json \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  ncu_profile sparse_decode
  cat "$OUT/summary.txt"; test_summary deepgemm_tests
  grep -E "^\| decode" "$OUT/flashmla_decode.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -30
  ;;
r4)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run flashmla_decode 90 env BENCH_PARTS=decode BENCH_JSON=flashmla_decode.json \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -E "^\| decode" "$OUT/flashmla_decode.txt"
  ;;
esac
pack_out
