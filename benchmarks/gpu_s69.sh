#!/usr/bin/env bash
# Session 69's GPU runs.
#   PART=epilogue (~330 s with two sides, ~450 s with three): session 68's prepared cut, the outputs by TMA (5bfd5c2,
#       cherry-picked as the tree), against main, the same bits expected. The sides, built from main (ac2b4b4):
#         git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src
#         git archive -o .ab-mid.tar.gz d8bbf5e packages/*/src runtime/src && git cherry-pick 5bfd5c2
#       base: main; new (the tree): main + the outputs by TMA; mid (only on an H200, which sessions 67-68 never got):
#       main before sessions 67 and 68, so one call also gives their H200 figure. attn_ab's steps: the hash, the
#       prefill part in ROUNDS (3) rounds, the decode part, the trace on base and new (its epilogue row),
#       mini-flashmla's GPU suite and the runtime's core GPU tests on the tree.
#   PART=halves (~330 s): the tiles handed over in two halves of 32 slots (the tree), against main (.ab-base.tar.gz,
#       ac2b4b4, as above); different bits expected (the row sums add the halves' sums): attn_ab's steps.
#   PART=ldg (~520 s): the quantized producer's chunks loaded into registers (the tree, main + the LDG experiment)
#       against main (base, .ab-base.tar.gz, ac2b4b4), the same bits expected: the hash, the prefill part in ROUNDS
#       (3) rounds, the trace, the decode part, mini-flashmla's GPU suite on the tree; then sessions 67-68 end to end
#       (session 68 measured the kernel only): bench_prefill.py (three sample layers at 4,096 tokens on an H100, seven
#       on an H200) on mid (.ab-mid.tar.gz, d8bbf5e: main before both) and base (main); the runtime's core GPU tests
#       on the tree if time is left. Ran with b72340a as the tree (0.75x); the next candidate, da65450 (the ids read a
#       chunk ahead; ship-ready with the staging ring removed as 2c08537), is prepared for `git cherry-pick 2c08537`
#       and the same part.
# carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s69
case "${PART:-epilogue}" in
epilogue)
  if [ "$CARD" = h200 ]; then attn_ab mid base new; else attn_ab base new; fi
  ;;
halves)
  attn_ab base new
  ;;
ldg)
  attn_ab_prefill base new mid base
  ;;
esac
pack_out
