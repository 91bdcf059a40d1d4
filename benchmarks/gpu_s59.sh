#!/usr/bin/env bash
# Session 59's GPU runs (H100, run 6 an H200); files under $OUT, packed by pack_out. Runs 1-3 were session 58's
# prepared runs (benchmarks/gpu_s58.sh r1, r2, then the PV split's control by hand: hash_sides mid and
# prefill_part_rounds 3 base mid new with .ab-mid.tar.gz = the tree of run 2 at PRODUCER_WARPS 4 and PV_N 128).
#   source .devdeps/env.sh && DEADLINE=300 PART=r4 bash benchmarks/gpu_s59.sh   (1 GPU): the Gluon attention's event
#       trace (mini_flashmla's GPU suite with its new test, the outputs' hash, benchmarks/exp_flashmla_trace.py)
#   PART=r6 (.ab-base.tar.gz = f8d7655, before the trace and the staged epilogue): the outputs leave through shared
#       memory in whole-row stores; mini_flashmla's GPU suite, the hash on both sides, bench_flashmla's prefill part
#       alternating, the trace, bench_flashmla (prefill and decode) on both sides
#   Run 5 was by hand: the trace test and exp_flashmla_trace.py after the host's constexpr fix
#   PART=r7 (never ran: the machine was taken back mid-call, then none could be started): it was to test the split
#       outputs' fp32 stores put back and the sink loaded at the start. The first is on main with the split path's
#       SASS equal to main's before; the second was dropped. Its commands were run 8's (removed here).
#   PART=r8 (prepared; device time ran out; session 60's gpu_s60.sh r3 / r4 carry it, with r9 in its r2): first
#       `git revert 174e125` (the tree is then b8f12bf's: one program per SM taking every 132nd item where the
#       block count is even, the next item's Q loaded under the last PVs, the outputs stored from an in-warp
#       transposed layout); .ab-alt.tar.gz = a2d2f77 (the persistent programs alone,
#       outputs staged in Q's shared memory), .ab-base.tar.gz = 4b75e81 (main: the staged epilogue). The tree's
#       mini_flashmla Gluon tests, the hash on all sides, the prefill part twice per side, the trace, the decode part
#       on the tree and main. If the tree fails and alt wins, alt's tests next (its sources, the tree's tests).
#   PART=r9 (prepared, ~70 s; after r8 in the same call or on a warm machine, .ab-base.tar.gz = 4b75e81): the
#       producer sleeping after finding tile 0 free, 0-700 ns (benchmarks/exp_flashmla_yield.py), on main's kernel
#       (its edit also applies to b8f12bf's source: checked offline).
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s59
case "${PART:-r4}" in
r4)
  flashmla_tests 120
  run hash_new 60 python3 benchmarks/attn_output_hash.py
  fits 60 && run trace 120 bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  cat "$OUT/summary.txt"; test_summary flashmla_tests; cat "$OUT/hash_new.txt"
  grep -v "^ *[0-9]* *\(wg\|producer\)" "$OUT/trace.txt" | head -60
  ;;
r8)
  run flashmla_tests 90 $PYTEST -n 16 packages/mini-flashmla/tests/test_kernels.py -k gluon \
    --junitxml="$OUT/junit_flashmla.xml"
  hash_sides new alt base
  prefill_part_rounds 2 base alt new
  fits 40 && run trace 30 bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  decode_parts 30 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests; grep -h sha256 "$OUT"/hash_*.txt
  grep -H "^| prefill_\(paged\|bf16\)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-110
  grep -H "^| decode batch [0-9]* (graph" "$OUT"/decode_part_*.txt | cut -c1-120
  grep -v "^ *-*[0-9]* *\(wg\|producer\)" "$OUT/trace.txt" | head -44
  ;;
r9)
  run yield 120 env PYTHONPATH="$(side_path base)" bash -c "cd benchmarks && python3 exp_flashmla_yield.py"
  cat "$OUT/summary.txt" "$OUT/yield.txt"
  ;;
r6)
  flashmla_tests 120
  hash_sides new base
  prefill_part_rounds 2 base new
  fits 60 && run trace 60 bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  fits 190 && flashmla_sides 90 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests; grep -h sha256 "$OUT"/hash_*.txt
  grep -H "^| prefill_\(paged\|bf16\)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-110
  grep -v "^ *-*[0-9]* *\(wg\|producer\)" "$OUT/trace.txt" | head -50; show_sides new base
  ;;
esac
pack_out
