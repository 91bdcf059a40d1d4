#!/usr/bin/env bash
# The engine's GPU check (issue 3), one script per run: the runtime tests on CUDA, the engine-vs-reference
# integration test, the offline example and the sampler benchmark. Run from the repo root on the GPU machine:
#   source .devdeps/env.sh && bash benchmarks/mini_deepinfer_gpu_check.sh
# Full logs go to $OUT; a short summary is printed last.
set -u
OUT=${OUT:-/tmp/mini_deepinfer_gpu_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" > "$OUT/versions.txt" 2>&1
date -u > "$OUT/date.txt"
# test_block_manager.py needs hypothesis, which the GPU machine lacks; it has no device code.
timeout 80 python3 -m pytest runtime/tests/test_sampler.py runtime/tests/test_scheduler.py runtime/tests/test_engine.py \
  runtime/tests/test_llm_api.py -q -rs -p no:cacheprovider > "$OUT/unit.txt" 2>&1
echo "unit rc=$?" >> "$OUT/summary.txt"
timeout 120 python3 -m pytest integration_tests/test_engine_vs_reference.py -q -s -rs -p no:cacheprovider > "$OUT/integration.txt" 2>&1
echo "integration rc=$?" >> "$OUT/summary.txt"
timeout 40 python3 runtime/examples/offline_inference.py > "$OUT/offline.txt" 2>&1
echo "offline rc=$?" >> "$OUT/summary.txt"
timeout 40 python3 benchmarks/mini_deepinfer_sampler.py --out "$OUT/sampler.json" > "$OUT/sampler.txt" 2>&1
echo "sampler bench rc=$?" >> "$OUT/summary.txt"
cat "$OUT/gpu.txt" "$OUT/versions.txt" "$OUT/summary.txt"
echo "--- unit";        grep -E "passed|failed|error" "$OUT/unit.txt" | tail -3
echo "--- integration"; grep -E "engine vs reference|passed|failed|error" "$OUT/integration.txt" | tail -14
echo "--- offline";     tail -4 "$OUT/offline.txt"
echo "--- sampler";     tail -6 "$OUT/sampler.txt"
