#!/usr/bin/env bash
# One GPU session for a prefill optimization round (issue 8): the GPU tests of the paths the round touched, then
# the 1-GPU benchmark (main run + profile + the token sweep), then EP2 x DP2 on 2 GPUs when there are 2.
#   on the GPU machine, from the repo root:  source .devdeps/env.sh && bash benchmarks/gpu_prefill_round.sh
# Env: TESTS (pytest node ids / paths, -m gpu), SWEEP (token counts), BOUNDED (prefill_keep_tokens values for
# bounded replay, e.g. 140,2414), EP_TESTS (multi-GPU pytest paths), DEEPEP=1 (mini-deepep's 2-rank benchmark last).
set -u
source "$(dirname "$0")/gpu_session.sh" /tmp/gpu_prefill_round
PYTEST="python3 -m pytest -v -s -rs -p no:cacheprovider"
GPUS=$(nvidia-smi -L | wc -l)
run tests "${TEST_SECS:-120}" $PYTEST -m gpu ${TESTS:-runtime/tests/test_moe_grouped.py} --junitxml="$OUT/junit_tests.xml"
run prefill 300 python3 benchmarks/bench_prefill.py --sweep "${SWEEP:-1024,2048,4096,8192,16384,32768}" \
  ${BOUNDED:+--bounded-replay "$BOUNDED"} --out "$OUT/prefill_h200.json"
if [ "$GPUS" -ge 2 ] && [ -n "${EP_TESTS:-}" ]; then  # after the 1-GPU benchmark, so they do not perturb it
  run ep_tests 150 $PYTEST -m multigpu $EP_TESTS --junitxml="$OUT/junit_ep_tests.xml"
fi
if [ "$GPUS" -ge 2 ]; then
  run prefill_ep2 200 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_prefill.py \
    --no-profile --out "$OUT/prefill_ep2_h200.json"
fi
if [ "$GPUS" -ge 2 ] && [ "${DEEPEP:-0}" = 1 ]; then
  run deepep 150 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_deepep.py
fi
cat "$OUT/env.txt" "$OUT/summary.txt"
for f in tests ep_tests; do [ -f "$OUT/$f.txt" ] && { echo "--- $f"; grep -E "PASSED|FAILED|ERROR|passed|failed|vs |max" "$OUT/$f.txt" | tail -30; }; done
echo "--- prefill"; grep -E "40-layer|sweep|bounded|^ +[0-9]|step as run|moe|stage|Error" "$OUT/prefill.txt" | tail -40
if [ -f "$OUT/prefill_ep2.txt" ]; then  # an `if`: a last `[ ] &&` made the script's rc 1 on a 1-GPU machine
  echo "--- prefill_ep2"; grep -E "40-layer|Error|error" "$OUT/prefill_ep2.txt" | tail -8
fi
if [ -f "$OUT/deepep.txt" ]; then echo "--- deepep"; tail -25 "$OUT/deepep.txt"; fi
