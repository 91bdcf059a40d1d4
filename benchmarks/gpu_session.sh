# Shared set-up of the GPU session scripts (gpu_suite.sh, gpu_prefill_round.sh, gpu_final_check.sh); sourced, with
# the default output folder as $1: $OUT created, pure-Python test wheels from .whl/ (e.g. hypothesis) on the
# path, the environment recorded in $OUT/env.txt, and `run NAME SECONDS CMD...` (output to $OUT/NAME.txt, SIGINT at
# the limit so pytest still prints its summary, one line per part in $OUT/summary.txt).
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
  date -u; git rev-parse --short HEAD 2>/dev/null; } > "$OUT/env.txt" 2>&1
run() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout -s INT "$secs" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? (${secs}s limit, took $((SECONDS - t0))s)" >> "$OUT/summary.txt"
}
# The device tool brings back at most 8 files of $OUT (session 12 run 4 lost 8 of its 16): pack_out leaves two,
# summary.txt and out.tar.gz with everything else (`tar xzf out.tar.gz`). Call it last.
pack_out() {
  local archive
  archive=$(mktemp --suffix=.tar.gz)
  tar czf "$archive" -C "$OUT" --exclude=./summary.txt . || return
  find "$OUT" -mindepth 1 ! -name summary.txt -delete
  mv "$archive" "$OUT/out.tar.gz"
}
