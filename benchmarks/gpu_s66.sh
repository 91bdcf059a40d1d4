#!/usr/bin/env bash
# Session 66's GPU runs.
#   PART=attn (any card): the Gluon attention's consumers, two reorders with the same bits expected. Sides: base =
#       .ab-base.tar.gz (main, 32bb0e3), alt = .ab-alt.tar.gz (cf76eac: warpgroup 1 releases tile a once its PV on
#       it is done, not after its QK^T of block b too), new = the tree (alt + warpgroup 0 issues its next block's
#       QK^T before it adopts block b). The outputs' hash on each side, bench_flashmla's prefill part in rounds and
#       its decode part on each side, the event trace on base and new.
#   PART=producer (any card): base = .ab-base.tar.gz (main's kernels, 32bb0e3), new = the tree (the quantized
#       producer loads each chunk's words one chunk ahead, across block boundaries, so that the next block's first
#       chunk is converted under the owner's QK^T): the hash on both, the prefill part in 3 rounds, the decode part,
#       the trace, mini-flashmla's GPU suite and the runtime's core GPU tests on the tree.
#   PART=breakdown (any card): exp_flashmla_gluon_breakdown.py on main's kernel, with session 66's variants (the
#       quantized producer's staging copies removed, or their scale words alone).
#   PART=scales (prepared for session 67, not run here): the tree = main with 4419483 applied (`git cherry-pick
#       4419483`: each row's scale bytes copied once), .ab-base.tar.gz = main's sources: the hash on both (same bits
#       expected), the prefill part in 3 rounds, the decode part, the trace, mini-flashmla's GPU suite and the
#       runtime's core GPU tests on the tree (PART=producer's steps). The breakdown (run 3) bounds the gain at ~4%.
#   PART=final (an H200 preferred): the final tree: mini-flashmla's GPU suite, the runtime's core GPU tests and the
#       rest of its suite where time allows (NO_REST=1: not).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s66
case "${PART:-attn}" in
attn)
  hash_sides base alt new
  prefill_part_rounds "${ROUNDS:-2}" base alt new
  decode_parts 60 base alt new
  trace_sides base new
  fits 150 && flashmla_tests 140
  attn_ab_summary
  test_summary flashmla_tests
  ;;
producer|scales)  # scales: the same A/B on the prepared scale-copy tree
  attn_ab base new
  ;;
breakdown)
  run breakdown 300 env OUT="$OUT" bash -c "cd benchmarks && python3 exp_flashmla_gluon_breakdown.py"
  grep -E "per_block|error" "$OUT/breakdown.txt"
  ;;
final)
  final_tree_checks
  ;;
esac
cat "$OUT/summary.txt"
pack_out
