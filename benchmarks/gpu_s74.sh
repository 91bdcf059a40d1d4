#!/usr/bin/env bash
# Session 74's GPU runs: the Triton route's FP8-MMA MoE kernel (gemm_fp4_e4m3_kernel.py) as session 73 left it
# (its second form: D = X W^T contiguous tiles, 16-byte weight copies) plus this session's late promotion
# (PROMOTE_LATE), which never ran on a GPU (docs/reports/triton-route-on-hopper.md).
#   PART=moe (~540 s): the kernel's tests and the Gluon route's FP8-MMA tests (-m gpu), exp_moe_triton_fp8.py on the
#       Triton route (tile sweep against the bf16-MMA route it would replace and the Gluon kernels, one process), then
#       bench_prefill on the Triton route before (base: .ab-base.tar.gz of a15b70f, the bf16-MMA route) and after
#       (the switch MINI_DEEPGEMM_TRITON_FP8_MOE=1 on), and the runtime's core GPU tests on it if time is left.
#   PART=decode (~300 s): session 73's owed decode part (gpu_s73.sh PART=decode).
# carry [".devdeps", ".ab-base.tar.gz"]; source .devdeps/env.sh && DEADLINE=N PART=moe bash THIS
set -u
if [ "${PART:-moe}" = decode ]; then exec bash benchmarks/gpu_s73.sh; fi
source benchmarks/gpu_session.sh /tmp/gpu_s74
run fp4_e4m3_tests 100 $PYTEST -n 8 packages/mini-deepgemm/tests/test_gemm_fp4_e4m3_triton.py \
  packages/mini-deepgemm/tests/test_gemm_fp4_e4m3.py -m gpu --junitxml="$OUT/junit_fp4_e4m3.xml"
run exp_moe_triton_fp8 200 env MINI_DEEPGEMM_GLUON=0 OUT="$OUT" bash -c "cd benchmarks && python3 exp_moe_triton_fp8.py"
for side in base new; do
  fits 120 && run "prefill_triton_$side" 115 env MINI_DEEPGEMM_GLUON=0 MINI_DEEPGEMM_TRITON_FP8_MOE=1 \
    PYTHONPATH="$(side_path $side)" \
    python3 benchmarks/bench_prefill.py "${PREFILL_LAYER_ARGS[@]}" --out "$OUT/prefill_triton_${side}_$CARD.json"
done
fits 100 && (export MINI_DEEPGEMM_GLUON=0 MINI_DEEPGEMM_TRITON_FP8_MOE=1
  runtime_core_tests $((${DEADLINE:-540} - SECONDS - 10)))
cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests
grep -h "^| " "$OUT/exp_moe_triton_fp8.txt" | cut -c1-600
grep -hE "tok/s|moe|attention" "$OUT"/prefill_*.txt 2>/dev/null | cut -c1-200
pack_out
