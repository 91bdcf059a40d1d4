"""Experiment (issue 4, sessions 21-22, 44, 50 and 52): the FP8-MMA masked MoE kernel's token tile, ring depth and
launch shape, on activations folded per 128.

Why: session 19 picked 16-token tiles up to ~16 rows per expert and 32 above, and a 2-deep ring, on per-32
activations, where the 32- and 64-token tiles needed 175 and 255 registers (2 CTAs per SM) and deeper rings cost
resident CTAs. Folded activations (SA_PER_128) took the 32-token tile to 128 registers offline, so (session 21) the
64-token tile might pay at ~32-64 rows per expert: it did at ~64 (routed since), not at ~32 (0.37-0.40 of the copy
rate against the issue's 0.6). Session 22: a deeper ring now costs no residency where registers already cap it
(offline, triton 3.6 / sm_90a, registers and shared memory per CTA at 2 / 3 / 4 stages: 16 tokens 98 / 80 / 98 and
37 / 47 / 57 KB, 4 / 4 / 3 CTAs per SM; 32 tokens 128 / 124 / 128 and 41 / 53 / 66 KB, 4 / 4 / 3; 64 tokens
233 / 235 / 233 and 49 / 66 / 82 KB, 2 CTAs at each), so session 22 swept the stages with the tiles.

Session 44: an 8-token tile (m64n8k32 MMAs: half the 16-token tile's tensor work and promotions, where one GPU's
decode has 1-3 rows per touched expert) and register caps that fit 5 or 6 CTAs per SM (offline, triton 3.6 /
sm_90a, 2 stages: 8 tokens 103 / 95 / 80 registers at caps 128 / 96 / 80, no stack; 16 tokens 118 / 96 with 16
bytes of stack), at 384 experts of ~1 / 2 / 4 rows and 96 of ~8 (run 1); then (run 2) one program per expert and
weight rows looping over the expert's token tiles against one program per tile, at the engine's capacities (max_m =
the batch: 64 / 128 / 256 tokens at ~1 / 2 / 4 rows, where one program per tile leaves 7 / 15 / 31 of every 8-token
expert's programs nothing to do).

Session 50: split tiles (gemm._masked_launches). A T-token tile takes an expert of T + 1 .. 2T rows in two
programs, each converting its weights, and at ~32 rows per expert (Poisson) ~45% of the experts have more than 32;
the kernel at ~32 rows is bound by issue and latency per converted weight step (session 45's profile), not by its
MMAs. So two launches: the experts of at most T rows on T-token tiles, the others on 2T-token tiles (64 tokens: 252
registers, 2 CTAs per SM, offline). At ~16 and ~32 rows on 96 experts, against one launch of T and of 2T tokens.

Session 52: ring slots of two K steps (gemm._masked_ring_slot, MaskedTile.k_per_slot): 3-D descriptors, K step
outermost, so each refill, its handshakes and the four CTA barriers the compiler puts around the copies come once per
two steps (session 51: those barriers took 5.4% of the 32-token tile's stall samples, the copy issue ~48 of its ~322
instructions per step). Offline (triton 3.6, sm_90a, w13), instructions per warp and K step at 8 / 16 / 32 / 64
tokens: one step 284 / 300 / 322 / 367; two unrolled 242 / 252 / 290 (56 bytes of stack at the 128-register cap) /
325; two in a loop 264.5 / 278.5 / 304 / 351.5. At each case the route's tiles with one step per slot, two unrolled
everywhere and two in a loop everywhere (session 52 run 1 measured a 3-deep ring of two steps too: slower at every
case). Session 53 routes two unrolled steps to the tiles of at most 16 tokens that are not split (the rows record
which slot the route takes), and measures two steps on the one-program launches only and a split's two launches on
two streams (gemm.MASKED_SPLIT_SIDE_STREAM: the wide launch fills the SMs the narrow one's last wave leaves idle),
and times each of a split's two launches alone (gemm._masked_launches cut to one).

Measured: each of CASES (experts, Poisson rows per expert, at least 1 and at most the capacity max_m), w13 and w2,
the public masked GEMM with folded weights and folded activations, each of VARIANTS forced through gemm._masked_tile
and gemm._masked_ring_slot; weight bytes per second as a fraction of the device copy (same process), GPU time by
CUDA-graph replay. Every variant's used rows are compared bitwise with the first's (each output element is the same
sequence of MMAs and FMAs). Writes $OUT/exp_moe_masked_tiles.json.

    cd benchmarks && python3 exp_moe_masked_tiles.py
"""

from __future__ import annotations

import json
import os

import torch

from bench_deepgemm import FP4_SCALE_BOUND, copy_bandwidth_gbs, masked_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.reference import fold_ue8m0_to_128

# (ring slot by the tile's tokens and split (K steps, unrolled), as gemm._masked_ring_slot; a split's wide launch on
# a side stream or not, gemm.MASKED_SPLIT_SIDE_STREAM) applied to the route's tiles; one step first. Session 52 measured
# three stages of two steps too: slower at every case. "two_narrow": two steps on the tiles of one program per expert
# (a split's narrow launch too: unrolled at 16 tokens, a loop at 32, whose unrolled slot spills), one on a split's
# wide launch and on 64-token tiles. "route_side_stream": session 53's route, the wide launch beside the narrow one
# (at ~16 and ~32 rows the route takes one step, so against one_step it isolates the stream; elsewhere there is one
# launch and it repeats a column). The other variants launch in series.
VARIANTS = {"one_step": (lambda tokens, split: (1, True), False),
            "two_unrolled": (lambda tokens, split: (2, True), False),
            "two_looped": (lambda tokens, split: (2, False), False),
            "two_narrow": (lambda tokens, split: (2, tokens <= 16) if split or tokens <= 16 else (1, True), False),
            "route_side_stream": (G._masked_ring_slot, True)}
# (experts, expected rows per expert, max_m): one GPU's decode at batch 64 / 256 (384 experts of ~1 / ~4 rows, the
# 8-token tile), then 96 experts of ~8 (16 tokens), ~16 and ~32 (split tiles) and ~64 rows (64 tokens)
CASES = ((384, 1, 64), (384, 4, 256), (96, 8, 128), (96, 16, 128), (96, 32, 128), (96, 64, 128))


def main() -> None:
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs, "rows": []}
    routed, routed_slot, routed_launches = G._masked_tile, G._masked_ring_slot, G._masked_launches
    routed_side_stream = G.MASKED_SPLIT_SIDE_STREAM
    for groups, expected_m, max_m in CASES:
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(groups, expected_m, N, K, max_m)
            sb = rand_fp4_weight_scales(groups, N, K // 32, low=118)
            (bq_route, folded), a128 = G.fold_fp4_weights(bq, sb), fold_ue8m0_to_128(a, sa, 1)
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            tile = routed(expected_m, True)
            row = {"experts": groups, "expected_m": expected_m, "max_m": max_m, "name": name,
                   "rows": int(masked.sum()), "routed": list(tile), "routed_slot": routed_slot(tile.tokens, tile.split)}
            first = None
            for key, (slot, side_stream) in VARIANTS.items():
                G._masked_ring_slot, G.MASKED_SPLIT_SIDE_STREAM = slot, side_stream  # slot: the split's wide launch
                steps, unrolled = slot(tile.tokens, tile.split)
                G._masked_tile = lambda *_args, t=tile._replace(k_per_slot=steps, slot_unrolled=unrolled): t
                out = torch.empty_like(d)
                t = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a128, (bq_route, sb), out, masked_m, expected_m,
                                                                   weight_scale_max=FP4_SCALE_BOUND, folded=folded))
                row[f"frac_of_copy_{key}"] = (bq.numel() + sb.numel()) / t / 1e6 / copy_gbs
                row[f"us_{key}"] = t * 1e3
                if first is None:
                    first = out[used].view(torch.int16)
                row[f"bitwise_{key}"] = bool(torch.equal(out[used].view(torch.int16), first))
            G._masked_tile, G._masked_ring_slot, G.MASKED_SPLIT_SIDE_STREAM = routed, routed_slot, routed_side_stream
            if tile.split:  # each of the route's two launches alone: where a split call's time goes
                for part, launch in zip(("narrow", "wide"), G._masked_launches(tile)):
                    G._masked_launches = lambda _tile, one=launch: [one]
                    row[f"us_{part}_alone"] = 1e3 * ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(
                        a128, (bq_route, sb), out, masked_m, expected_m, weight_scale_max=FP4_SCALE_BOUND,
                        folded=folded))
                G._masked_launches = routed_launches
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_masked_tiles.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"| experts, rows, max_m | GEMM | tile, routed steps per slot | {' | '.join(VARIANTS)} | bitwise |")
    for r in result["rows"]:
        fracs = " | ".join(f"{r[f'frac_of_copy_{k}']:.3f}" for k in VARIANTS)
        print(f"| {r['experts']}, ~{r['expected_m']}, {r['max_m']} | {r['name']} | {r['routed'][0]}, "
              f"{r['routed_slot'][0]} | {fracs} | {all(r[f'bitwise_{k}'] for k in VARIANTS)} |")
    for r in (r for r in result["rows"] if "us_wide_alone" in r):
        print(f"split ~{r['expected_m']} {r['name']}: narrow alone {r['us_narrow_alone']:.1f} us + wide alone "
              f"{r['us_wide_alone']:.1f} = {r['us_narrow_alone'] + r['us_wide_alone']:.1f}; in series "
              f"{r['us_one_step']:.1f}, side stream {r['us_route_side_stream']:.1f}")


if __name__ == "__main__":
    main()
