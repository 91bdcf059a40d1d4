#!/usr/bin/env bash
# Session 68's GPU runs.
#   PART=chain (an H200 preferred; ~470 s at ROUNDS=2): session 67's prepared cuts in the consumers' chain, each the
#       same bits expected, against main (4142ca0; its sources as archived at 77d5373). The sides, built from main:
#         git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 6659059 && git archive -o .ab-mid.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 5a8b733 && git archive -o .ab-alt.tar.gz HEAD packages/*/src runtime/src
#         git reset --hard HEAD~1 && git cherry-pick 02835ea
#       mid: `_adopt` fences the tile between its two waits; alt: mid at 216 / 80 registers (the control for new's
#       split); new (the tree): mid + P through registers. Each side: the hash, the prefill part in ROUNDS rounds, the
#       decode part; the trace on alt and new; mini-flashmla's GPU suite and the runtime's core GPU tests on the tree.
#   PART=confirm (~250 s): run 1 put new 1.012x base on paged rows and 0.986x on bf16 rows (two rounds each, H100),
#       within this benchmark's noise between sides; base (.ab-base.tar.gz, main 77d5373) against new (the tree,
#       02835ea's P through registers, its trace without the P-free marks) again: the hash on both, the prefill part in
#       ROUNDS (4) rounds, the decode part; the trace and mini-flashmla's GPU suite on the tree.
#   PART=h200 (an H200 wanted; ~260 s): what sessions 67 and 68 shipped, on an H200: base = .ab-base.tar.gz (d8bbf5e,
#       main before both), mid = .ab-mid.tar.gz (4142ca0: the scale copies), new = the tree (and P through registers),
#       and alt = .ab-alt.tar.gz (the tree + session 66's early release of tile a, R, again: neutral then, when the
#       consumers' chain was longer; 142f61a, reverted by ac7c6b4): the hash on each, the prefill part in ROUNDS (3)
#       rounds, mini-flashmla's GPU suite on the tree.
#   PART=release (~70 s on a warm machine): alt (.ab-alt.tar.gz, the early release) against new (the tree) in ROUNDS
#       (4) more rounds, and the trace on alt. Run 4 ran these steps inline on run 3's warm machine (`bash -c 'source
#       benchmarks/gpu_session.sh /tmp/gpu_s68b; prefill_part_rounds 4 alt new; trace_sides alt; ...'`).
#   PART=epilogue (prepared for session 69, not run here; ~330 s): the outputs by TMA (5bfd5c2) against main, the same
#       bits expected. Build the sides from main:
#         git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src && git cherry-pick 5bfd5c2
#       then attn_ab's steps on base and new (the tree): the hash, the prefill part in ROUNDS (3) rounds, the decode
#       part, the trace on both (its epilogue row), mini-flashmla's GPU suite and the runtime's core GPU tests.
# carry [".devdeps", ".ab-base.tar.gz", ...]; source .devdeps/env.sh && DEADLINE=N ROUNDS=R PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s68
case "${PART:-chain}" in
chain)
  attn_ab base mid alt new
  ;;
confirm)
  hash_sides base new
  prefill_part_rounds "${ROUNDS:-4}" base new
  decode_parts 60 base new
  trace_sides new
  fits 110 && flashmla_tests 100
  attn_ab_summary
  test_summary flashmla_tests
  ;;
h200)
  hash_sides base mid alt new
  prefill_part_rounds "${ROUNDS:-3}" base mid alt new
  fits 90 && flashmla_tests 80
  attn_ab_summary
  test_summary flashmla_tests
  ;;
release)
  prefill_part_rounds "${ROUNDS:-4}" alt new
  trace_sides alt
  attn_ab_summary
  ;;
epilogue)
  attn_ab base new
  ;;
esac
cat "$OUT/summary.txt"
pack_out
