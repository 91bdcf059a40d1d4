#!/usr/bin/env bash
# Session 77's GPU call: the Triton route (MINI_DEEPGEMM_GLUON=0) with session 76's defaults on an H200, whose figures
# sessions 75-76 (H100 only) owed, and where its attention's paged block time goes.
#   PART=h200 (~250 s on an H100; an H200 asked for, either card taken, the card in env.txt): bench_flashmla's prefill
#       and decode parts on the Triton route (the decode split rule of session 76), bench_fp4_e4m3_route on it (the
#       FP8-MMA MoE kernel on by default, and its peers), bench_decode (medium model, batch 32 / 64 at 131,072 tokens)
#       on the Triton route and then on the Gluon route in the same call (the same-card ratio), and one Nsight Compute
#       report of the Triton paged prefill attention (profile_ncu.py sparse_prefill, NCU_TAG _triton).
#   PART=prefetch (~210 s on an H100, the Triton route): the attention's quantized rows gathered a block ahead (the
#       tree) against main before it (.ab-base.tar.gz): attn_output_hash.py on each side (the same bits?),
#       bench_flashmla's prefill part twice per side in turns, its decode part on each side, then
#       exp_attn_one_source.py on the tree (each source in its own launch, now with the prefetch).
#   PART=rest (~200 s on an H100, the Triton route, nothing else set: the FP8-MMA MoE kernel on by default since
#       session 76): the rest of the runtime's GPU suite (parts A and B), which had not run on that default.
# carry [".devdeps"] (PART=prefetch: and ".ab-base.tar.gz"); source .devdeps/env.sh && DEADLINE=N PART=... bash THIS
set -u
source benchmarks/gpu_session.sh /tmp/gpu_s77
case "${PART:-h200}" in
h200)
  export MINI_DEEPGEMM_GLUON=0
  flashmla_sides 150 triton
  fits 100 && route_sides 100 triton
  fits 100 && decode_bench decode_triton
  unset MINI_DEEPGEMM_GLUON
  fits 100 && decode_bench decode_gluon
  fits 80 && (export MINI_DEEPGEMM_GLUON=0 NCU_TAG=_triton NCU_SECS=$((${DEADLINE:-540} - SECONDS - 15));
              ncu_profile sparse_prefill)
  cat "$OUT/summary.txt"
  grep -hE "^\| (prefill_(paged|bf16)_tflops|decode)" "$OUT/flashmla_triton.txt" | cut -c1-300
  grep -h "^| contiguous\|^| masked" "$OUT"/route_*.txt
  grep -hE "graphs=1" "$OUT"/decode_*.txt 2>/dev/null | cut -c1-200
  ;;
prefetch)
  export MINI_DEEPGEMM_GLUON=0
  hash_sides base new
  prefill_part_rounds 2 base new
  decode_parts 60 base new
  fits 40 && script_sides 40 exp_attn_one_source.py one_source new
  cat "$OUT/summary.txt"; cat "$OUT"/hash_*.txt
  grep -hE "^\| prefill_(paged|bf16)_tflops" "$OUT"/prefill_part_*.txt | cut -c1-200
  grep -hE "^\| decode batch [0-9]+ \(graph" "$OUT"/decode_part_*.txt | cut -c1-120
  grep -h "^| " "$OUT"/one_source_new.txt
  ;;
rest)
  export MINI_DEEPGEMM_GLUON=0
  rest_ab 150 $((${DEADLINE:-540} - 170))
  cat "$OUT/summary.txt"; test_summary runtime_rest_a runtime_rest_b
  ;;
esac
pack_out
