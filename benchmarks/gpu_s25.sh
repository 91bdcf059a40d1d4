#!/usr/bin/env bash
# Session 25's GPU runs (docs/reports/gpu-session-2026-12-02-s25.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s25.sh   (1 x H200, tree = main with the attention kernel's
#       register-pipelined quantized producer and the overflow-proof flip index, .ab-base.tar.gz = main before the
#       session: the mini-flashmla GPU tests; bench_flashmla and bench_prefill on both; the attention breakdown on the
#       tree; exp_moe_masked_rega.py)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s25.sh   (1 x H200, tree = main with the producer's chunks
#       staged by cp.async, .ab-mid.tar.gz = 646cb39 (the register-pipelined producer, 3 chunks ahead),
#       .ab-base.tar.gz = main before the session: the mini-flashmla and the runtime's core GPU tests on the tree;
#       bench_flashmla and bench_prefill on the three; the breakdown on tree and mid; Nsight Compute of the paged
#       prefill)
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s25.sh   (1 x H200, tree = 320fb3b: the staged producer
#       reading each chunk's rows a chunk ahead; .ab-alt.tar.gz = the same with 200 consumer / 112 producer registers;
#       .ab-mid.tar.gz = run 2's staged producer; .ab-base.tar.gz = main before the session: the mini-flashmla GPU
#       tests on the tree; bench_flashmla on the four, bench_prefill on tree, alt and base; the breakdown on tree and
#       alt; Nsight Compute of the paged prefill on the tree)
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s25.sh   (1 x H200, tree = main with the staged producer
#       (run 3's kernel, SASS identical): the runtime's core GPU tests and both parts of the rest, the mini-flashmla and
#       mini-deepgemm GPU suites)
# (exp_moe_masked_rega.py, which run 1 ran, was removed when the package took its natural-order kernel in session
# 26: git show 31d70c7:benchmarks/exp_moe_masked_rega.py)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s25
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 60 new base
  run breakdown 70 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  run rega 100 bash -c "cd benchmarks && python3 exp_moe_masked_rega.py"
  prefill_sides 70 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new base
  tail -14 "$OUT/breakdown.txt"
  tail -12 "$OUT/rega.txt" | cut -c1-250
  ;;
r2)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  flashmla_sides 60 new mid base
  run breakdown 70 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  run breakdown_mid 70 env PYTHONPATH="$(side_path mid)" \
    bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  prefill_sides 70 new mid base
  ncu_profile sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  show_sides new mid base
  for f in breakdown breakdown_mid; do echo "== $f"; tail -14 "$OUT/$f.txt"; done
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -24
  ;;
r3)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 60 new alt mid base
  run breakdown 70 bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  run breakdown_alt 70 env PYTHONPATH="$(side_path alt)" \
    bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  prefill_sides 70 new alt base
  ncu_profile sparse_prefill
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new alt mid base
  for f in breakdown breakdown_alt; do echo "== $f"; tail -14 "$OUT/$f.txt"; done
  python3 benchmarks/ncu_summary.py "$OUT/ncu" 2>&1 | head -24
  ;;
r4)
  run runtime_tests 120 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  rest_ab 80 110
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run deepgemm_tests 150 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  cat "$OUT/summary.txt"; test_summary runtime_tests runtime_rest_a runtime_rest_b flashmla_tests deepgemm_tests
  ;;
esac
pack_out
