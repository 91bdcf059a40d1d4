#!/usr/bin/env bash
# Session 10's single-GPU run (docs/reports/gpu-session-2026-12-01-s10.md): the Gluon V3 GEMM's tests and experiment,
# mini-deepep's combine v7 at one rank on NVSHMEM (scenarios + stress), the interpreter test under triton 3.6.
#   source .devdeps/env.sh && bash benchmarks/gpu_s10.sh      (files under $OUT)
set -u
OUT=${OUT:-/tmp/gpu_s10}
mkdir -p "$OUT"
nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepgemm/tests/test_gemm_gluon_fp8.py \
  --junitxml="$OUT/junit_gluon_v3.xml" 2>&1 | tail -15
(cd benchmarks && timeout 200 python3 exp_gemm_gluon_v3.py 2>&1 | tail -22)
timeout 150 python3 - <<'PY' 2>&1 | tail -5
from mini_deepep import Buffer
from mini_deepep.testing import spawn_ranks
nvl = Buffer.get_nvl_buffer_size_hint(1024, 1024, 6, 2)
spawn_ranks(1, ("nvshmem", "torch"), nvl, on_gpu=True)
print("one-rank scenarios (nvshmem + torch): passed")
spawn_ranks(1, ("nvshmem",), nvl, on_gpu=True, driver="stress", rounds=20, wait_timeout_s=60.0)
print("one-rank stress, 20 rounds: passed")
PY
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider packages/mini-deepep/tests/test_interpreted_kernels.py 2>&1 | tail -3
