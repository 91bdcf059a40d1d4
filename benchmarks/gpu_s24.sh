#!/usr/bin/env bash
# Session 24's GPU runs (docs/reports/gpu-session-2026-12-02-s24.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s24.sh   (1 x H200, tree = main + the persistent attention
#       kernel (3e180de), baseline = main's src folders in .ab-base.tar.gz: the mini-flashmla GPU tests on the tree;
#       bench_flashmla (prefill, decode) and bench_prefill on both; exp_flashmla_seesaw.py on main's kernel module)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s24
if [ -f .ab-mid.tar.gz ]; then
  mkdir -p /tmp/ab-mid && tar xzf .ab-mid.tar.gz -C /tmp/ab-mid
  MID_PYTHONPATH=/tmp/ab-mid/packages/mini-flashmla/src:$PYTHONPATH
fi
# side_path SIDE: the PYTHONPATH of a side of an A/B (new = the tree, mid = .ab-mid.tar.gz, base = .ab-base.tar.gz)
side_path() { case $1 in base) echo "$BASE_PYTHONPATH" ;; mid) echo "$MID_PYTHONPATH" ;; *) echo "$PYTHONPATH" ;; esac; }
# flashmla_sides SECS SIDE...: bench_flashmla (prefill, decode) on each side, into $OUT/flashmla_SIDE.{txt,json}
flashmla_sides() {
  local secs=$1 side; shift
  for side in "$@"; do
    run "flashmla_$side" "$secs" env PYTHONPATH="$(side_path $side)" BENCH_PARTS=prefill,decode \
      BENCH_JSON="flashmla_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
}
# prefill_sides SECS SIDE...: bench_prefill on each side, into $OUT/prefill_SIDE*
prefill_sides() {
  local secs=$1 side; shift
  for side in "$@"; do
    run "prefill_$side" "$secs" env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      --out "$OUT/prefill_${side}_h200.json"
  done
}
# show_sides SIDE...: the prefill / decode rows of flashmla_SIDE and the step and attention lines of prefill_SIDE
show_sides() {
  local side
  for side in "$@"; do
    echo "== $side"
    [ -f "$OUT/flashmla_$side.txt" ] && grep -E "^\| (prefill|decode)" "$OUT/flashmla_$side.txt"
    [ -f "$OUT/prefill_$side.txt" ] && grep -E "tok/s|attention" "$OUT/prefill_$side.txt" | cut -c1-200 | head -4
  done
}
case "${PART:-r1}" in
r1)
  run flashmla_tests 150 $PYTEST -n 4 packages/mini-flashmla/tests -m gpu
  flashmla_sides 60 new base
  run seesaw 200 env PYTHONPATH="$BASE_PYTHONPATH" bash -c "cd benchmarks && python3 exp_flashmla_seesaw.py"
  prefill_sides 70 new base
  cat "$OUT/summary.txt"; test_summary flashmla_tests
  show_sides new base
  tail -30 "$OUT/seesaw.txt" | cut -c1-250
  ;;
esac
pack_out
