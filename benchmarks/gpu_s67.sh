#!/usr/bin/env bash
# Session 67's GPU runs.
#   PART=scales (any card): base = .ab-base.tar.gz (main's sources, d8bbf5e), new = the tree (4419483 cherry-picked:
#       the quantized producer copies each row's scale bytes once): the hash on both (same bits expected), the
#       prefill part in 3 rounds, the decode part, the trace, mini-flashmla's GPU suite and the runtime's core GPU
#       tests on the tree. Session 66's breakdown (run 3) bounds the gain at ~4%.
#   PART=release (an H200 preferred): base = .ab-base.tar.gz (main before the scale copies, d8bbf5e), alt =
#       .ab-alt.tar.gz (the scale copies, ece62e2), new = the tree (alt + the consumers' per-thread releases of tiles
#       and P): the hash on each (the same bits expected), the prefill part in 3 rounds, the decode part, the trace on
#       alt and new, mini-flashmla's GPU suite and the runtime's core GPU tests on the tree.
#   PART=fence (an H200 preferred): the same steps as PART=release on base = .ab-base.tar.gz (d8bbf5e), alt =
#       .ab-alt.tar.gz (main: the scale copies, 59a951f), new = the tree (alt + the quantized producer's writer-side
#       proxy fence, the consumers' fences after their tile waits removed).
#   PART=confirm (an H200 wanted; ~200 s): the final tree (main: the scale copies) against .ab-base.tar.gz (d8bbf5e):
#       the hash on both, the prefill part in ROUNDS (2) rounds, mini-flashmla's GPU suite on the tree.
#   PART=adopt (prepared for session 68, not run here): base = .ab-base.tar.gz (main's sources: `git archive -o
#       .ab-base.tar.gz HEAD packages/*/src runtime/src`), alt = .ab-alt.tar.gz (main with 6659059 cherry-picked:
#       `_adopt` fences the tile between its two waits, off the consumers' chain), new = the tree (alt with eca29a6
#       cherry-picked too: each consumer waits for the other's P-free under its own QK^T): PART=release's steps.
#       Expected: the same bits on all three, up to ~2-3% paged prefill (run 3's trace: the adopts' fences cost
#       ~170-210 cycles each; the P-free waits ~100 each with their marks).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s67
case "${PART:-scales}" in
scales)
  attn_ab base new
  ;;
release|fence|adopt)
  attn_ab base alt new
  ;;
confirm)
  hash_sides base new
  prefill_part_rounds "${ROUNDS:-2}" base new
  fits 110 && flashmla_tests 100
  attn_ab_summary
  test_summary flashmla_tests
  ;;
esac
cat "$OUT/summary.txt"
pack_out
