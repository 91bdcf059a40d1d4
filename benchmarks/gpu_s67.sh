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
#   PART=chain (prepared for session 68, not run here): cuts in the consumers' chain, each the same bits expected,
#       against main. Build the sides from main:
#         git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 6659059 && git archive -o .ab-mid.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 5a8b733 && git archive -o .ab-alt.tar.gz HEAD packages/*/src runtime/src
#         git reset --hard HEAD~1 && git cherry-pick 02835ea
#       mid: `_adopt` fences the tile between its two waits; alt: mid at 216 / 80 registers (the control for new's
#       split); new (the tree): mid + P through registers (ldmatrix for the other warpgroup's P, no P-free barriers,
#       no proxy fence in the publish; 216 / 80 registers). PART=release's steps on four sides (ROUNDS=2 to fit ~470
#       s; carry .ab-mid.tar.gz too). Expected from run 3's trace: ~2-3% for mid, up to ~6% for new. (eca29a6, the
#       P-free waits under the QK^Ts on mid, is the smaller alternative to new and not a side here.)
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s67
case "${PART:-scales}" in
scales)
  attn_ab base new
  ;;
release|fence)
  attn_ab base alt new
  ;;
chain)
  attn_ab base mid alt new
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
