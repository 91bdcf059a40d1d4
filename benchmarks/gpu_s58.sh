#!/usr/bin/env bash
# Session 58's prepared GPU runs (no machine ran them in session 58: docs/reports/flashmla-gluon.md, "Session 58");
# files under $OUT, packed by pack_out. First `git revert 5ab3cdd`: the tree is then c3ddb9d's, variant B (below);
# build the sides with `git archive -o .ab-NAME.tar.gz REV packages/*/src runtime/src`.
#   source .devdeps/env.sh && DEADLINE=560 PART=r1 bash benchmarks/gpu_s58.sh   (1 GPU; tree = session 57's fixes
#       (the FP8-MMA route's packed-weight descriptors built per call, on main since 2946c1b; DecodeGraphs capturing
#       with the cyclic collector off), the attention's empty-slot mask applied by one FFMA computed under the
#       QK^T, and two producer warpgroups, variant B (each thread half the words of a chunk); .ab-alt.tar.gz =
#       07c611f, without the fixes): test_gemm_fp4_e4m3.py, test_cuda_decode.py on the tree and on 07c611f (its new
#       capture test should fail there), mini-flashmla's GPU suite, the runtime's core GPU tests
#   PART=r2 (tree as run 1; .ab-alt.tar.gz = fb3753c, variant A: chunks of twice the rows, one in flight;
#       .ab-mid.tar.gz = 25047da, the mask change alone; .ab-base.tar.gz = 178ad86, neither attention change): the
#       outputs' hash on each side, bench_flashmla's prefill part twice per side in alternation, bench_flashmla
#       (prefill and decode) and bench_prefill. If A wins, its GPU suite runs next (its tree's sources with the tree's
#       tests, deselecting test_the_gluon_producers_layouts_cover_a_chunk_once, which reads B's constants). The PV
#       split's control: either tree with PRODUCER_WARPS 4 and PV_N forced to 128, as a side.
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s58
case "${PART:-r1}" in
r1)
  fp4_e4m3_tests 130
  run cuda_decode_new 90 $PYTEST -n 4 runtime/tests/test_cuda_decode.py --junitxml="$OUT/junit_cuda_decode_new.xml"
  run cuda_decode_alt 60 env PYTHONPATH="$(side_path alt)" $PYTEST runtime/tests/test_cuda_decode.py \
    -k "dead_engines_graphs"
  flashmla_tests 150
  fits 100 && run runtime_tests 140 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests cuda_decode_new cuda_decode_alt flashmla_tests runtime_tests
  grep -h "^FAILED\|^ERROR" "$OUT"/*.txt | cut -c1-200
  ;;
r2)
  hash_sides new alt mid base
  prefill_part_rounds 2 base mid alt new
  fits 200 && flashmla_sides 90 new alt base
  fits 100 && prefill_sides 95 new base
  cat "$OUT/summary.txt"; grep -h "sha256" "$OUT"/hash_*.txt
  grep -H "^| prefill" "$OUT"/prefill_part_*.txt | cut -c1-140; show_sides new alt base
  ;;
esac
pack_out
