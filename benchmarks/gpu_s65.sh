#!/usr/bin/env bash
# Session 65's GPU runs.
#   PART=attn (any card): the Gluon attention's running max moved only past RESCALE_LOG2 (the rescale of both
#       warpgroups' accumulators skipped where no row moved). Sides: base = .ab-base.tar.gz (main, eb953f1), alt =
#       .ab-alt.tar.gz (the flag decided for the whole warpgroup by a cross-warp max in the owner), new = the tree
#       (each row decides; the warpgroup reads all 64 row flags after the publish barrier). mini-flashmla's GPU suite
#       on the tree, bench_flashmla's prefill part in 3 rounds on the three sides in turn, its decode part on each.
#   PART=attn2 (any card): base = .ab-base.tar.gz (main, 4c273f0), alt = .ab-alt.tar.gz (93a57a7: the owner's pfree
#       arrival is also its tile's release, one arrive and its barriers fewer per warpgroup and pair), new = the tree
#       (alt + the indexer's q offsets in 64 bits, a head-major q copied where its head offsets pass 2**31, attention
#       launches split by queries where the ids offsets would). The attention outputs' hash on each side (same bits
#       expected), mini-flashmla's GPU suite on the tree (the new past-2**31 tests), bench_flashmla's prefill part in 3
#       rounds and its decode part on each side, its indexer part on base and new.
#   PART=debts (an H200): session 64's owed mini-deepgemm tests (test_gemm_gluon_fp8.py, test_gemm.py,
#       test_gemm_fp4_e4m3.py; mini-deepgemm unchanged since) and exp_gemm_gluon_v3.py at M = 4,096 and 16,384.
#   PART=final (any card): the final tree (kernels main's; the host splits launches and copies q past 2**31):
#       mini-flashmla's GPU suite, the runtime's core GPU tests and the rest of its suite where time allows (NO_REST=1:
#       not; run 5 after the review mend).
# carry [".devdeps", ".ab-base.tar.gz", ".ab-alt.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s65
case "${PART:-attn}" in
attn)
  flashmla_tests 150
  prefill_part_rounds 3 base alt new
  decode_parts 60 base alt new
  test_summary flashmla_tests
  for f in "$OUT"/prefill_part_*.txt; do echo "$(basename "$f" .txt): $(grep -E "^\| prefill" "$f" | tr -s ' ' | cut -c1-150)"; done
  for f in "$OUT"/decode_part_*.txt; do echo "$(basename "$f" .txt)"; grep -E "^\| decode" "$f" | tr -s ' ' | cut -c1-150; done
  ;;
attn2)
  hash_sides base alt new
  flashmla_tests 170
  prefill_part_rounds 3 base alt new
  decode_parts 60 base alt new
  for side in base new; do
    fits 60 && run "indexer_part_$side" 60 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=indexer \
      BENCH_JSON="flashmla_indexer_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
  test_summary flashmla_tests
  cat "$OUT"/hash_*.txt
  for f in "$OUT"/prefill_part_*.txt; do echo "$(basename "$f" .txt): $(grep -E "^\| prefill_(paged|bf16)_tflops" "$f" | tr -s ' ' | cut -c1-60 | tr '\n' ' ')"; done
  for f in "$OUT"/decode_part_*.txt; do echo "$(basename "$f" .txt)"; grep -E "^\| decode batch [0-9]+ \(graph" "$f" | cut -c1-60; done
  for f in "$OUT"/indexer_part_*.txt; do echo "$(basename "$f" .txt)"; grep -E "^\| (indexer|top-k|scores)" "$f" | cut -c1-150; done
  ;;
debts)
  run dense_tests 110 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
    packages/mini-deepgemm/tests/test_gemm.py --junitxml="$OUT/junit_dense.xml"
  fits 160 && fp4_e4m3_tests 150
  fits 170 && script_sides 160 "exp_gemm_gluon_v3.py --m 4096 16384" v3_exp new
  test_summary dense_tests fp4_e4m3_tests
  [ -f "$OUT/v3_exp_new.txt" ] && grep -E "^\| |smoke" "$OUT/v3_exp_new.txt"
  ;;
final)
  final_tree_checks
  ;;
esac
cat "$OUT/summary.txt"
pack_out
