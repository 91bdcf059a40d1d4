#!/usr/bin/env bash
# Session 45's GPU runs (docs/reports/gpu-session-2026-12-04-s45.md); files under $OUT, packed by pack_out.
#   source .devdeps/env.sh && PART=r1 bash benchmarks/gpu_s45.sh   (1 x H200; tree = main: the FP8-MMA MoE route's
#       weights in the kernels' order; .ab-base.tar.gz = dd4381f, session 44's last tree): mini-deepgemm's GPU suite;
#       session 44's unrun edits (test_linear_fp32.py, test_moe_route.py); exp_moe_weight_order on both sides; the
#       runtime's core GPU tests; bench_decode (seven sample layers, batch 32 / 64, 131,072 tokens) on both sides
#       (the tree's side ran out of memory: KernelWeights reordered into new tensors while the caller held the old)
#   PART=r2 (tree = main: the order's words 4c + q, reordered in place; the same base): mini-deepgemm's GPU suite;
#       exp_moe_weight_order, the runtime's core GPU tests, bench_decode and bench_prefill, each on both sides
#   PART=r3 (tree = main, the session's final source: max_num_seqs 256 by default; the same base): the FP8-MMA MoE
#       kernels' tests; the runtime's core GPU tests and the rest of the runtime suite; LLM with its defaults on the
#       tiny checkpoint (CUDA graphs to 256 rows); bench_decode at batch 64 / 256, 32,768 tokens, on both sides
#   PART=r4 (tree = main): Nsight Compute on the masked MoE kernel in the route's order at one GPU's decode (384
#       experts of ~1 row) and at ~32 rows (profile_ncu's masked384_w13_fold128, masked32_w13_fold128)
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s45
case "${PART:-r1}" in
r1)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  run s44_edits 90 $PYTEST -n 8 runtime/tests/test_linear_fp32.py runtime/tests/test_moe_route.py \
    --junitxml="$OUT/junit_s44_edits.xml"
  script_sides 120 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests s44_edits runtime_tests
  grep -hE "^\|" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/order_new.txt" "$OUT/order_base.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  ;;
r2)
  run deepgemm_tests 150 $PYTEST -n 8 packages/mini-deepgemm/tests --junitxml="$OUT/junit_deepgemm.xml"
  script_sides 120 exp_moe_weight_order.py order new base
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  decode_all_sides new base
  prefill_sides 100 new base
  cat "$OUT/summary.txt"; test_summary deepgemm_tests runtime_tests
  grep -hE "^\|" "$OUT/order_new.txt" "$OUT/order_base.txt"
  grep -m3 -hE "Error|error" "$OUT/order_new.txt" "$OUT/order_base.txt" "$OUT/decode_new.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_new.txt" "$OUT/decode_base.txt"
  grep -hE "tok/s|moe experts" "$OUT/prefill_new.txt" "$OUT/prefill_base.txt" | cut -c1-200
  ;;
r3)
  fp4_e4m3_tests 90
  run runtime_tests 130 $PYTEST $RUNTIME_CORE_TESTS -m "not multigpu" -n 16 --junitxml="$OUT/junit_runtime.xml"
  rest_ab 80 140
  run llm_defaults 90 python3 -c "from mini_deepinfer import LLM, SamplingParams
llm = LLM('tiny-random/deepseek-v4.1-flash-1017', max_model_len=512, kv_cache_memory_gb=2)
print('max_num_seqs', llm.engine.config.max_num_seqs)
outs = llm.generate([[5 + i] * (20 + 7 * i) for i in range(40)], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
print('generated', [len(o.token_ids) for o in outs])"
  for side in new base; do
    run "decode_wide_$side" 200 env PYTHONPATH="$(side_path $side)" python3 benchmarks/bench_decode.py --preset medium \
      --layers "$ALL_LAYERS" --batches 64,256 --contexts 32768 --kv-cache-gb 24 $([ $side = new ] && echo --profile) \
      --out "$OUT/decode_wide_${side}_h200.json"
  done
  cat "$OUT/summary.txt"; test_summary fp4_e4m3_tests runtime_tests runtime_rest_a runtime_rest_b
  tail -3 "$OUT/llm_defaults.txt" | cut -c1-300
  grep -hE "graphs=1|^moe experts |^stage" "$OUT/decode_wide_new.txt" "$OUT/decode_wide_base.txt"
  grep -m3 -hE "Error|error" "$OUT/decode_wide_new.txt" "$OUT/decode_wide_base.txt" | cut -c1-300
  ;;
r4)
  NCU_SECS=75 ncu_profile masked384_w13_fold128 masked32_w13_fold128
  cat "$OUT/summary.txt"
  python3 benchmarks/ncu_summary.py "$OUT/ncu" masked384_w13_fold128 masked32_w13_fold128 2>&1 | head -60
  ;;
esac
pack_out
