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
esac
pack_out
