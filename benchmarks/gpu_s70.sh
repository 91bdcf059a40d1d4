#!/usr/bin/env bash
# Session 70's GPU runs.
#   PART=ldg (~430 s): session 69's prepared cut, the quantized producer's chunks loaded into registers with each
#       chunk's ids read a chunk ahead (2c08537, cherry-picked as the tree: main + the cut, the staging ring removed),
#       against main (base, .ab-base.tar.gz: `git archive -o .ab-base.tar.gz HEAD packages/*/src runtime/src` at
#       1413932), the same bits expected: the hash, the prefill part in ROUNDS (3) rounds, the trace, the decode part,
#       mini-flashmla's GPU suite on the tree, bench_prefill.py on base and the tree (three sample layers at 4,096
#       tokens on an H100, seven on an H200), the runtime's core GPU tests on the tree if time is left.
#   PART=feed (~420 s): the contiguous FP8 x FP4 kernel's 128-row tiles on folded activations with two feeder
#       warpgroups (the tree) against main (base, .ab-base.tar.gz as above): test_gemm_fp4_e4m3.py on the tree,
#       exp_moe_contiguous_swapab.py (the contiguous kernel on both sides, the swap-AB kernel beside it on the tree
#       for a bitwise check against an unchanged kernel), bench_prefill.py on base and the tree (the MoE experts
#       stage at ~64 rows per expert), the runtime's core GPU tests on the tree.
#   PART=h200 (~400 s, an H200 only; elsewhere it stops at once): the owed H200 figures of main's attention, where
#       sessions 67-68's cuts never ran: mid (.ab-mid.tar.gz, `git archive -o .ab-mid.tar.gz d8bbf5e packages/*/src
#       runtime/src`: main before both) against the tree (main) by attn_ab (the hash, the prefill part in 3 rounds, the
#       decode part, the trace, mini-flashmla's GPU suite and the runtime's core GPU tests on the tree), then
#       test_gemm_fp4_e4m3.py on the tree.
# carry [".devdeps", ".ab-base.tar.gz", ".ab-mid.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s70
case "${PART:-ldg}" in
ldg)
  attn_ab_prefill base new base new
  ;;
h200)
  if [ "$CARD" != h200 ]; then
    echo "not an H200 ($CARD): nothing run"
  else
    attn_ab mid new
    fits 60 && fp4_e4m3_tests 50
    test_summary fp4_e4m3_tests
  fi
  ;;
feed)
  fp4_e4m3_tests 150
  script_sides 150 "exp_moe_contiguous_swapab.py --variants contiguous_kernel" contig base
  script_sides 150 "exp_moe_contiguous_swapab.py --variants contiguous_kernel swapab" contig new
  fits 200 && prefill_sides 110 base new
  fits 100 && runtime_core_tests 95
  grep -h "^| " "$OUT"/contig_*.txt
  grep -h "moe experts\|step as run" "$OUT"/prefill_*.txt
  test_summary fp4_e4m3_tests runtime_tests
  ;;
esac
pack_out
