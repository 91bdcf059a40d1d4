#!/usr/bin/env bash
# Session 27's GPU runs (docs/reports/gpu-session-2026-12-02-s27.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main with the Gluon split rule
#       down to one block per split (5d2e38a cherry-picked): exp_moe_contiguous_rega.py (the contiguous MoE kernel
#       swap-AB with register-A weights, against the shipped kernel and torch._scaled_grouped_mm); the mini-flashmla
#       GPU suite and the runtime's core GPU tests; bench_flashmla's decode)
#   source .devdeps/env.sh && PART=r2 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main: exp_moe_contiguous_rings.py
#       (the contiguous MoE kernel on three decoupled rings, seven depth configurations, against the shipped kernel
#       and torch._scaled_grouped_mm); exp_moe_masked_tiles.py (token tile x ring depth on the register-A masked
#       kernel))
#   source .devdeps/env.sh && PART=r3 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main: exp_moe_contiguous_conv8.py
#       (the contiguous MoE kernel with two 4-warp converter partitions, two register splits))
#   source .devdeps/env.sh && PART=r4 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main: Nsight Compute of the shipped
#       contiguous kernel (w13, folded) and of exp_moe_breakdown.py's variants without the conversion and without
#       the MMAs; ncu_summary.py's per-partition reading of each)
#   source .devdeps/env.sh && PART=r5 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main: exp_moe_coalesced_scales.py
#       (the contiguous kernel's per-step offset and activation-scale loads from transposed, coalesced tensors))
#   source .devdeps/env.sh && PART=r6 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main with the folded offsets
#       step-major, .ab-base.tar.gz = the commit before it: the mini-deepgemm GPU suite and the runtime's core GPU
#       tests on the tree; bench_fp4_e4m3_route on both)
#   source .devdeps/env.sh && PART=r7 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main with the contiguous converter
#       loading 4 steps' offsets at once, .ab-base.tar.gz = the commit before it: the mini-deepgemm GPU suite and the
#       runtime's core GPU tests on the tree; bench_fp4_e4m3_route on both)
#   source .devdeps/env.sh && PART=r8 bash benchmarks/gpu_s27.sh   (1 x H200, tree = main after the review (the sink
#       converted once, the block count in one helper): the mini-flashmla GPU suite, bench_flashmla's decode, the
#       runtime's core GPU tests)
# The three contiguous-kernel experiments were removed after their runs (all negative or neutral,
# docs/reports/deepgemm-moe-fold-128.md, "Session 27"): git show 5d67ecb:benchmarks/exp_moe_contiguous_rega.py,
# 5d67ecb:benchmarks/exp_moe_contiguous_rings.py, d3006e0:benchmarks/exp_moe_contiguous_conv8.py; run 5's
# exp_moe_coalesced_scales.py too once its offsets layout shipped (its edits no longer apply): git show
# 459aa54:benchmarks/exp_moe_coalesced_scales.py
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s27
case "${PART:-r1}" in
r1)
  run contig_rega 150 bash -c "cd benchmarks && python3 exp_moe_contiguous_rega.py"
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  run flashmla_decode 90 env BENCH_PARTS=decode BENCH_JSON=flashmla_decode.json \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  tail -25 "$OUT/contig_rega.txt" | cut -c1-250
  grep -E "^\| decode" "$OUT/flashmla_decode.txt"
  ;;
r2)
  run contig_rings 240 bash -c "cd benchmarks && python3 exp_moe_contiguous_rings.py"
  run masked_tiles 200 bash -c "cd benchmarks && python3 exp_moe_masked_tiles.py"
  cat "$OUT/summary.txt"
  grep -vE '^\{' "$OUT/contig_rings.txt" | tail -22 | cut -c1-200
  grep -vE '^\{' "$OUT/masked_tiles.txt" | tail -16 | cut -c1-200
  ;;
r3)
  run contig_conv8 150 bash -c "cd benchmarks && python3 exp_moe_contiguous_conv8.py"
  cat "$OUT/summary.txt"
  grep -vE '^\{' "$OUT/contig_conv8.txt" | tail -12 | cut -c1-200
  ;;
r4)
  ncu_profile moe_w13_fold128 moe_w13_fold128_no_convert moe_w13_fold128_no_mma
  cat "$OUT/summary.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" moe_w13_fold128 moe_w13_fold128_no_convert moe_w13_fold128_no_mma 2>&1 \
    | cut -c1-230
  ;;
r5)
  run coalesced 150 bash -c "cd benchmarks && python3 exp_moe_coalesced_scales.py"
  cat "$OUT/summary.txt"
  grep -vE '^\{' "$OUT/coalesced.txt" | tail -10 | cut -c1-200
  ;;
r6|r7)
  run deepgemm_tests 160 $PYTEST -n 4 packages/mini-deepgemm/tests -m gpu
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  route_sides 90 new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  for s in new base; do echo "== route $s"; grep -E "^\| " "$OUT/route_$s.txt" | cut -c1-200; done
  ;;
r8)
  run flashmla_tests 120 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  run flashmla_decode 70 env BENCH_PARTS=decode BENCH_JSON=flashmla_decode.json \
    bash -c "cd benchmarks && python3 bench_flashmla.py"
  run runtime_tests 110 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  cat "$OUT/summary.txt"; test_summary flashmla_tests runtime_tests
  grep -E "^\| decode" "$OUT/flashmla_decode.txt"
  ;;
esac
pack_out
