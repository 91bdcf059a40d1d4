# Shared set-up of the GPU session scripts (gpu_suite.sh, gpu_prefill_round.sh, gpu_final_check.sh); sourced, with the
# default output folder as $1: $OUT created, pure-Python test wheels from .whl/ (e.g. hypothesis) on the path, the
# environment recorded in $OUT/env.txt, `run NAME SECONDS CMD...` (output to $OUT/NAME.txt, SIGINT at the limit so
# pytest still prints its summary, one line per part in $OUT/summary.txt), `$PYTEST`, `v41_tests`, `fits`,
# `fp4_e4m3_tests`, `flashmla_tests`, `runtime_core_tests`, `decode_bench`, `decode_all_sides`, `test_summary`,
# `rest_ab`, `rest_b`, `tree_checks`, `final_tree_checks`, the A/B helpers (`side_path`, `hash_sides`,
# `flashmla_sides`, `prefill_sides`, `script_sides`, `route_sides`, `show_sides`, `prefill_part_rounds`,
# `trace_sides`, `attn_ab_summary`, `attn_ab`, `attn_ab_prefill`), `ncu_profile CASE...` and `pack_out`.
OUT=${OUT:-$1}
mkdir -p "$OUT"
# 2 CPU threads per process: many processes with one thread per core each oversubscribed the GPU machine's cores
# and made the CPU-side oracles the long pole (2026-11-30)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  date -u
  # the device copy's .git is stale (its HEAD is not the tree that runs): name the tree by the files that run, the
  # hash `bash benchmarks/src_tree_hash.sh` prints for a checkout here
  echo "src tree $(bash benchmarks/src_tree_hash.sh)"; } > "$OUT/env.txt" 2>&1
# The card (h100, h200, ... from nvidia-smi's name) names the benchmarks' JSON files, and its memory decides whether
# bench_prefill's and bench_decode's seven sample layers fit: not on an H100's 80 GB (sessions 53-55), where the
# helpers below take three prefill layers and the decode preset's default layers at 8 GB of KV cache instead.
CARD=$(head -1 "$OUT/env.txt" | grep -oE "[ABH][0-9]+" | head -1 | tr 'A-Z' 'a-z')
CARD=${CARD:-gpu}
GPU_MIB=$(head -1 "$OUT/env.txt" | grep -oE "[0-9]+ MiB" | cut -d' ' -f1)
ALL_LAYERS=window,window+engram,r2-full,r2-reuse,r1-full,r1-reindex,r1-reuse  # every layer mode of the real model
if [ "${GPU_MIB:-0}" -gt 100000 ]; then
  PREFILL_LAYER_ARGS=() DECODE_LAYER_ARGS=(--layers "$ALL_LAYERS" --kv-cache-gb 24)
else
  PREFILL_LAYER_ARGS=(--tokens 4096 --layers window,r1-full,r1-reuse) DECODE_LAYER_ARGS=(--kv-cache-gb 8)
fi
# the session scripts' pytest command (quiet, skips listed with their reasons)
PYTEST="python3 -m pytest -q -rs -p no:cacheprovider -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning"
# decode_bench NAME [PREFIX...]: bench_decode, medium model, batch 32 / 64 at 131,072 tokens, PREFIX (e.g. env
# PYTHONPATH=...) in front, into $OUT/NAME*
decode_bench() {
  local name=$1; shift
  run "$name" 120 "$@" python3 benchmarks/bench_decode.py --preset medium --batches 32,64 --contexts 131072 \
    --kv-cache-gb 8 --out "$OUT/${name}_$CARD.json"
}
# fits SECS: at least SECS left before DEADLINE (default 540 s of the script), so that a call cut short by the device
# time left still packs and prints what ran
fits() { [ $((${DEADLINE:-540} - SECONDS)) -gt "$1" ]; }
run() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout -s INT "$secs" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? (${secs}s limit, took $((SECONDS - t0))s)" >> "$OUT/summary.txt"
}
# The runtime's GPU tests of the MoE GEMMs, decode and the model / engine against the reference: the set a
# mini-deepgemm change runs first (`$PYTEST $RUNTIME_CORE_TESTS ...`); `$RUNTIME_CORE_IGNORES` leaves them out of a
# run over runtime/tests and integration_tests (the rest of the runtime suite, ~470 s with -n 16 on one H200).
RUNTIME_CORE_TESTS="runtime/tests/test_moe_grouped.py runtime/tests/test_moe_kernels.py
  runtime/tests/test_cuda_decode.py runtime/tests/test_decode_path.py integration_tests/test_model_vs_reference.py
  integration_tests/test_engine_vs_reference.py"
RUNTIME_CORE_IGNORES=""
for f in $RUNTIME_CORE_TESTS; do RUNTIME_CORE_IGNORES="$RUNTIME_CORE_IGNORES --ignore=$f"; done
# The rest no longer fits one 600 s device call (session 20 run 5 was cut at ~96%): two parts, the five files with the
# most test time in session 18's junit (~250 of ~380 s summed) and everything else:
#   $PYTEST $RUNTIME_REST_A ...   and   $PYTEST runtime/tests integration_tests $RUNTIME_REST_B_IGNORES ...
RUNTIME_REST_A="runtime/tests/test_bounded_replay.py runtime/tests/test_hyper_connections.py
  runtime/tests/test_parallel.py runtime/tests/test_bench_prefill_smoke.py runtime/tests/test_reference_model.py"
# Part B ran into the 600 s call limit in session 21 (run 4), as the whole rest did in sessions 18 and 20, with the
# two data-parallel engine tests never finishing on one GPU machine. Session 22 run 2 found why: their ranks were
# forked, and a forked rank's first multi-threaded op deadlocked in OpenMP wherever a rank got several threads (16
# cores here, 2 in CPU CI); generate_data_parallel spawns them since.
RUNTIME_REST_B_IGNORES=$RUNTIME_CORE_IGNORES
for f in $RUNTIME_REST_A; do RUNTIME_REST_B_IGNORES="$RUNTIME_REST_B_IGNORES --ignore=$f"; done
# The wheel test builds each package with `uv build --offline`, which needs the build backend (hatchling) in uv's
# cache: CI's has it (its `uv run` builds the workspace), the GPU machine's does not (session 65 run 4: 3 errors,
# "hatchling was not found in the cache"). It is a CPU packaging test; CI runs it.
RUNTIME_REST_B_IGNORES="$RUNTIME_REST_B_IGNORES --deselect
  integration_tests/test_packages_stand_alone.py::test_the_package_installs_from_its_wheel_into_a_fresh_venv_and_computes"
# v41_tests SECS: mini-deepgemm's V4.1 GEMM tests and the dense batch-invariance test (-n 8, output
# $OUT/v41_tests.txt, junit in $OUT)
v41_tests() {
  run v41_tests "$1" $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_gluon_v41.py \
    "packages/mini-deepgemm/tests/test_gemm.py::test_ue8m0_results_do_not_depend_on_the_batch" \
    --junitxml="$OUT/junit_v41.xml"
}
# fp4_e4m3_tests SECS: mini-deepgemm's FP8-MMA MoE kernel tests, test_gemm_fp4_e4m3.py (-n 8, output
# $OUT/fp4_e4m3_tests.txt, junit in $OUT)
fp4_e4m3_tests() {
  run fp4_e4m3_tests "$1" $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py \
    --junitxml="$OUT/junit_fp4_e4m3.xml"
}
# flashmla_tests SECS: mini-flashmla's GPU suite (-n 8, output $OUT/flashmla_tests.txt, junit in $OUT)
flashmla_tests() {
  run flashmla_tests "$1" $PYTEST -n 8 packages/mini-flashmla/tests --junitxml="$OUT/junit_flashmla.xml"
}
# runtime_core_tests SECS: the runtime's core GPU tests (-n 16, output $OUT/runtime_tests.txt, junit in $OUT)
runtime_core_tests() {
  run runtime_tests "$1" $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
}
# test_summary NAME...: the pytest summary lines and first assertion lines of $OUT/NAME.txt (those that ran), for the
# call's output
test_summary() {
  local files=() n
  for n in "$@"; do [ -f "$OUT/$n.txt" ] && files+=("$OUT/$n.txt"); done
  [ ${#files[@]} -gt 0 ] || return 0
  grep -hE " (FAILED|ERROR) |passed|failed" "${files[@]}" | tail -12
  grep -hE "^E  .*(Error|assert)" "${files[@]}" | cut -c1-250 | head -8
}
# rest_ab [SECS_A SECS_B]: parts A and B of the rest of the runtime's GPU suite (-n 16, junit in $OUT)
rest_ab() {
  run runtime_rest_a "${1:-90}" $PYTEST $RUNTIME_REST_A -m "not multigpu" -n 16 --junitxml="$OUT/junit_rest_a.xml"
  run runtime_rest_b "${2:-130}" $PYTEST runtime/tests integration_tests $RUNTIME_REST_B_IGNORES -m "not multigpu" \
    -n 16 --junitxml="$OUT/junit_rest_b.xml"
}
# final_tree_checks: a session's last run when its GPU change is mini-flashmla's or none: mini-flashmla's GPU suite,
# the runtime's core GPU tests, and the rest of the runtime suite where time allows (NO_REST=1: not); the summaries
final_tree_checks() {
  flashmla_tests 170
  fits 140 && runtime_core_tests 130
  fits 220 && [ -z "${NO_REST:-}" ] && rest_ab 75 130
  test_summary flashmla_tests runtime_tests runtime_rest_a runtime_rest_b
}
# tree_checks NAME REST_B_SECS STAGES TEST_FILE...: a session's last run on its final tree: the change's own tests
# (pytest -n 8, output $OUT/NAME.txt), the runtime's core GPU tests, bench_decode on the tree (decode_all_sides new),
# the rest of the runtime suite (rest_ab 75 REST_B_SECS); then the summaries and the decode rows of the stages
# matching STAGES (an extended regex, e.g. "indexer|hc")
tree_checks() {
  local name=$1 rest_b_secs=$2 stages=$3; shift 3
  run "$name" 60 $PYTEST -n 8 "$@" --junitxml="$OUT/junit_$name.xml"
  runtime_core_tests 110
  decode_all_sides new
  rest_ab 75 "$rest_b_secs"
  cat "$OUT/summary.txt"; test_summary "$name" runtime_tests runtime_rest_a runtime_rest_b
  grep -hE "graphs=1|^($stages) |^stage" "$OUT/decode_new.txt"
}
# rest_b SECS: part B of the rest of the runtime suite (-n 16, junit in $OUT), then its summary
rest_b() {
  run runtime_rest_b "$1" $PYTEST runtime/tests integration_tests $RUNTIME_REST_B_IGNORES -m "not multigpu" -n 16 \
    --junitxml="$OUT/junit_rest_b.xml"
  cat "$OUT/summary.txt"; test_summary runtime_rest_b
}
# Same-run A/B against another commit: here, `git archive -o .ab-base.tar.gz REV packages/*/src runtime/src`
# (ignored; name it in carry). Then `run NAME SECS env PYTHONPATH="$BASE_PYTHONPATH" CMD...` runs CMD with REV's
# src folders ahead of the tree's: the same benchmark script, the baseline's kernels and runtime.
if [ -f .ab-base.tar.gz ]; then
  mkdir -p /tmp/ab-base && tar xzf .ab-base.tar.gz -C /tmp/ab-base
  BASE_PYTHONPATH=$(ls -d /tmp/ab-base/packages/*/src /tmp/ab-base/runtime/src | tr '\n' ':')$PYTHONPATH
fi
# A second tree (`git archive -o .ab-mid.tar.gz REV <src folders>`): MID_PYTHONPATH puts its src folders first.
if [ -f .ab-mid.tar.gz ]; then
  mkdir -p /tmp/ab-mid && tar xzf .ab-mid.tar.gz -C /tmp/ab-mid
  MID_PYTHONPATH=$(ls -d /tmp/ab-mid/packages/*/src /tmp/ab-mid/runtime/src 2>/dev/null | tr '\n' ':')$PYTHONPATH
fi
# A third (`.ab-alt.tar.gz`, any tree with those src folders): ALT_PYTHONPATH.
if [ -f .ab-alt.tar.gz ]; then
  mkdir -p /tmp/ab-alt && tar xzf .ab-alt.tar.gz -C /tmp/ab-alt
  ALT_PYTHONPATH=$(ls -d /tmp/ab-alt/packages/*/src /tmp/ab-alt/runtime/src 2>/dev/null | tr '\n' ':')$PYTHONPATH
fi
# side_path SIDE: the PYTHONPATH of a side of an A/B (new = the tree, mid = .ab-mid.tar.gz, alt = .ab-alt.tar.gz,
# base = .ab-base.tar.gz)
side_path() {
  case $1 in base) echo "$BASE_PYTHONPATH" ;; mid) echo "$MID_PYTHONPATH" ;; alt) echo "$ALT_PYTHONPATH" ;;
    *) echo "$PYTHONPATH" ;; esac
}
# decode_all_sides SIDE...: bench_decode with all seven sample layers (every layer mode of the real model; the
# preset's default layers where they do not fit, DECODE_LAYER_ARGS), batch 32 / 64 at 131,072 tokens, --profile, on
# each side, into $OUT/decode_SIDE.{txt,_CARD.json}
decode_all_sides() {
  local side
  for side in "$@"; do
    run "decode_$side" 200 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      "${DECODE_LAYER_ARGS[@]}" --batches 32,64 --contexts 131072 --profile --out "$OUT/decode_${side}_$CARD.json"
  done
}
# flashmla_sides SECS SIDE...: bench_flashmla (prefill, decode) on each side, into $OUT/flashmla_SIDE.{txt,json}
# (~40 s a side since session 26's decode split sweep; give it 110)
flashmla_sides() {
  local secs=$1 side; shift
  for side in "$@"; do
    run "flashmla_$side" "$secs" env PYTHONPATH="$(side_path $side)" BENCH_PARTS=prefill,decode \
      BENCH_JSON="flashmla_$side.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
}
# prefill_sides SECS SIDE...: bench_prefill (three sample layers where seven do not fit: PREFILL_LAYER_ARGS) on each
# side, into $OUT/prefill_SIDE.txt and prefill_SIDE_CARD.json
prefill_sides() {
  local secs=$1 side; shift
  for side in "$@"; do
    run "prefill_$side" "$secs" env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_prefill.py \
      "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_${side}_$CARD.json"
  done
}
# script_sides SECS SCRIPT NAME SIDE...: benchmarks/SCRIPT (run from benchmarks/, its OUT $OUT/NAME_SIDE) on each
# side, its output into $OUT/NAME_SIDE.txt
script_sides() {
  local secs=$1 script=$2 name=$3 side; shift 3
  for side in "$@"; do
    run "${name}_$side" "$secs" env PYTHONPATH="$(side_path $side)" OUT="$OUT/${name}_$side" \
      bash -c "mkdir -p \$OUT && cd benchmarks && python3 $script"
  done
}
# route_sides SECS SIDE...: bench_fp4_e4m3_route on each side, into $OUT/route_SIDE.txt
route_sides() {
  local secs=$1; shift
  script_sides "$secs" bench_fp4_e4m3_route.py route "$@"
}
# hash_sides SIDE...: attn_output_hash.py (one SHA-256 over the attention's outputs) on each side, into
# $OUT/hash_SIDE.txt: a kernel change that keeps every bit gives every side the same line
hash_sides() {
  local side
  for side in "$@"; do
    run "hash_$side" 60 env PYTHONPATH="$(side_path $side)" python3 benchmarks/attn_output_hash.py
  done
}
# prefill_part_rounds ROUNDS SIDE...: bench_flashmla's prefill part ROUNDS times on every side, the sides in turn within
# a round (so that a drift of the card's clocks falls on all of them), into $OUT/prefill_part_SIDE_ROUND.txt
prefill_part_rounds() {
  local rounds=$1 i side; shift
  for i in $(seq "$rounds"); do
    for side in "$@"; do
      fits 30 && run "prefill_part_${side}_$i" 40 env PYTHONPATH="$(side_path $side)" BENCH_PARTS=prefill \
        BENCH_JSON="flashmla_${side}_$i.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
    done
  done
}
# decode_parts SECS SIDE...: bench_flashmla's decode part on each side, into $OUT/decode_part_SIDE.txt and
# flashmla_decode_SIDE.json (SIDE_$ROUND in both names where ROUND is set; ~37 s a side on a fresh H100, its compiles
# included: give it 60)
decode_parts() {
  local secs=$1 side name; shift
  for side in "$@"; do
    name=$side${ROUND:+_$ROUND}
    fits "$secs" && run "decode_part_$name" "$secs" env PYTHONPATH="$(side_path $side)" BENCH_PARTS=decode \
      BENCH_JSON="flashmla_decode_$name.json" bash -c "cd benchmarks && python3 bench_flashmla.py"
  done
}
# trace_sides SIDE...: benchmarks/exp_flashmla_trace.py (the attention's event trace) on each side, into
# $OUT/trace_SIDE.txt
trace_sides() {
  local side
  for side in "$@"; do
    fits 50 && run "trace_$side" 45 env PYTHONPATH="$(side_path $side)" \
      bash -c "cd benchmarks && python3 exp_flashmla_trace.py"
  done
}
# attn_ab_summary: an attention A/B's results for the call's output: the outputs' hash per side, bench_flashmla's
# prefill TFLOP/s per side and round, its decode rows per side, and the paged table of each side's trace
attn_ab_summary() {
  local f
  cat "$OUT"/hash_*.txt 2>/dev/null
  for f in "$OUT"/prefill_part_*.txt; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .txt): $(grep -E "^\| prefill_(paged|bf16)_tflops" "$f" | tr -s ' ' | cut -c1-60 |
      tr '\n' ' ')"
  done
  for f in "$OUT"/decode_part_*.txt; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .txt)"; grep -E "^\| decode batch [0-9]+ \(graph" "$f" | cut -c1-60
  done
  for f in "$OUT"/trace_*.txt; do
    [ -f "$f" ] || continue
    echo "== $f"; grep -A22 "== paged" "$f" | grep -v "^ *-*[0-9]* *\(wg\|producer\) "
  done
}
# attn_ab SIDE...: an attention kernel's A/B with the tests on the tree: the outputs' hash on every side, the prefill
# part in ROUNDS (3) rounds, the decode part, the trace on the last two sides, mini-flashmla's GPU suite and the
# runtime's core GPU tests where time allows, then the A/B's summary and the tests'
attn_ab() {
  local sides=("$@")
  hash_sides "${sides[@]}"
  prefill_part_rounds "${ROUNDS:-3}" "${sides[@]}"
  decode_parts 60 "${sides[@]}"
  trace_sides "${sides[@]: -2}"
  fits 130 && flashmla_tests 120
  fits 150 && runtime_core_tests 140
  attn_ab_summary
  test_summary flashmla_tests runtime_tests
}
# attn_ab_prefill A B PREFILL_SIDE...: an attention kernel's A/B with the step end to end: the outputs' hash, the
# prefill part in ROUNDS (3) rounds, the trace and the decode part on sides A and B, mini-flashmla's GPU suite on the
# tree, bench_prefill.py on each PREFILL_SIDE and the runtime's core GPU tests where time allows, then the summaries
attn_ab_prefill() {
  local a=$1 b=$2; shift 2
  hash_sides "$a" "$b"
  prefill_part_rounds "${ROUNDS:-3}" "$a" "$b"
  trace_sides "$a" "$b"
  decode_parts 60 "$a" "$b"
  fits 130 && flashmla_tests 120
  fits 240 && prefill_sides 110 "$@"
  fits 80 && runtime_core_tests 75
  attn_ab_summary
  test_summary flashmla_tests runtime_tests
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
# ncu_profile CASE...: one Nsight Compute report per benchmarks/profile_ncu.py case under $OUT/ncu (clocks left
# alone, as the device notes ask), exported as text: the sections' details, the per-SASS-instruction source page (stall
# samples, gzipped) and every raw metric. The binary report is dropped (a run carries the tree, 64 MiB at most;
# profile_ncu.py regenerates one in ~20 s); benchmarks/ncu_summary.py reads the exports, plain or gzipped.
# NCU_TAG (optional) is appended to the files' names, e.g. to profile another side's tree under its PYTHONPATH;
# NCU_SECS (default 180) is each case's limit. A case MODULE:FACTORY:ARG names its files MODULE_FACTORY_ARG.
ncu_profile() {
  local ncu c c0
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  mkdir -p "$OUT/ncu"
  for c0 in "$@"; do
    c=${c0//:/_}${NCU_TAG:-}
    run "ncu_$c" "${NCU_SECS:-180}" bash -c "cd benchmarks && $ncu --profile-from-start off --clock-control none --set full \
      -f -o $OUT/ncu/$c python3 profile_ncu.py $c0"
    "$ncu" --import "$OUT/ncu/$c.ncu-rep" --page details > "$OUT/ncu/${c}_details.txt" 2>&1
    "$ncu" --import "$OUT/ncu/$c.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/${c}_sass.csv" 2>&1
    gzip -9 -f "$OUT/ncu/${c}_sass.csv"  # ~2.4 MB plain, ~0.12 MB gzipped: the data folders are committed
    "$ncu" --import "$OUT/ncu/$c.ncu-rep" --page raw --csv > "$OUT/ncu/${c}_raw.csv" 2>&1
    gzip -9 -f "$OUT/ncu/${c}_raw.csv"  # ~165 KB plain, ~16 KB gzipped (session 45: the tree a run carries)
    rm -f "$OUT/ncu/$c.ncu-rep"
  done
}
# The device tool brings back at most 8 files of $OUT (session 12 run 4 lost 8 of its 16): pack_out leaves two,
# summary.txt and out.tar.gz with everything else (`tar xzf out.tar.gz`). Call it last.
pack_out() {
  local archive
  archive=$(mktemp --suffix=.tar.gz)
  find "$OUT" -name "junit*.xml" -exec gzip -9 -n {} +  # stored gzipped in docs/reports/data (the tree a run carries)
  tar czf "$archive" -C "$OUT" --exclude=./summary.txt . || return
  find "$OUT" -mindepth 1 ! -name summary.txt -delete
  mv "$archive" "$OUT/out.tar.gz"
}
