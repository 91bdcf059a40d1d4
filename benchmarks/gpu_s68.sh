#!/usr/bin/env bash
# Session 68's GPU runs.
#   PART=chain (an H200 preferred; ~470 s at ROUNDS=2): session 67's prepared cuts in the consumers' chain, each the
#       same bits expected, against main (4142ca0). The sides, built from main:
#         git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 6659059 && git archive -o .ab-mid.tar.gz HEAD packages/*/src runtime/src
#         git cherry-pick 5a8b733 && git archive -o .ab-alt.tar.gz HEAD packages/*/src runtime/src
#         git reset --hard HEAD~1 && git cherry-pick 02835ea
#       mid: `_adopt` fences the tile between its two waits; alt: mid at 216 / 80 registers (the control for new's
#       split); new (the tree): mid + P through registers. Each side: the hash, the prefill part in ROUNDS rounds, the
#       decode part; the trace on alt and new; mini-flashmla's GPU suite and the runtime's core GPU tests on the tree.
# carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz", ".ab-alt.tar.gz"];
# source .devdeps/env.sh && DEADLINE=N ROUNDS=2 PART=chain bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s68
case "${PART:-chain}" in
chain)
  attn_ab base mid alt new
  ;;
esac
cat "$OUT/summary.txt"
pack_out
