"""Experiment (issue 4, session 19): the masked MoE decode GEMM (FP8 activations x FP4 expert weights, few rows per
expert) on FP8 tensor cores, the weights converted e2m1 -> e4m3 with their scales folded per weight row, as
exp_gemm_fp8_moe.py does for prefill.

Why: the shipped masked kernel streams the expert weights at 0.45-0.47 of the device-copy rate at ~8 rows per
expert and 0.35 at ~32 (issue 4's target: 0.6; bench_deepgemm s18 run 2). It is bound by instruction issue, and most
of its instructions convert FP4 to bf16: 2.5-3 per value (`gemm_gluon_kernel._PAIR_PTX`). exp_gemm_fp8_moe.py's
conversion to e4m3 takes 9 per 8 values, and FP8 MMAs take the activations as they are, so the activation pass in
front of the shipped GEMM goes too (deepgemm-fp8-moe.md).

How (one warpgroup per CTA, no warp specialization; the grid is (N / 128 weight-row tiles, experts, token tiles),
and a token tile past the expert's masked_m returns at once):
- per step (K = 128), a STAGES-deep TMA ring brings the tile's 128 weight rows x 64 packed bytes and the expert's
  BLOCK_M activation rows x 128 e4m3; the next steps' copies are issued a ring ahead;
- each thread converts one weight row (16 words, inline PTX of exp_gemm_fp8_moe) into a [128, 128] e4m3 tile in
  shared memory, fences, and the warpgroup syncs;
- swap-AB: per 32 of K two m64nBLOCK_Mk32 MMAs (weight rows 0-63 and 64-127 from shared memory, the activations as
  B), then acc += part * sa[token, kb] (the scale of the accumulator's column);
- the epilogue multiplies each weight row by 2^(ref - 127) and stores d[g, token, n] for the used tokens.
The folded weight scales (fold_weight_scales) are exp_gemm_fp8_moe's. Like it, its rows are not bitwise equal to
the shipped FP4 paths.

Measured here: bench_deepgemm's masked cases (96 experts, Poisson(8) and Poisson(32) rows, w13 and w2), weight bytes
per second as a fraction of the device copy measured in the same process, against the shipped masked call (activation
pass + bf16-MMA GEMM), GPU time by CUDA-graph replay; calc_diff against the reference on the used rows. Writes
$OUT/exp_gemm_fp8_masked.json.

    cd benchmarks && timeout 300 python3 exp_gemm_fp8_masked.py
"""

from __future__ import annotations

import json
import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

from exp_gemm_fp8_moe import (LUT_HI_BASE, LUT_HI_STEP, LUT_LO_BASE, LUT_LO_STEP, RAW_LAYOUT,  # beside this script
                              _E2M1_TO_E4M3_PTX, fold_weight_scales)
from mini_deepgemm.gemm_gluon_fp8_kernel import _ue8m0_to_f32


@gluon.jit
def _issue(w_desc, x_desc, w_ring, x_ring, ready, k, w_row, x_row):
    """TMA step k's packed weights [128, 64 bytes] and activations [BLOCK_M, 128] into ring slot k % STAGES."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    slot = k % STAGES
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(w_desc, [w_row, k * 64], ready.index(slot), w_ring.index(slot))
    tma.async_copy_global_to_shared(x_desc, [x_row, k * 128], ready.index(slot), x_ring.index(slot))


@gluon.jit
def fp8_fp4_masked_fp8mma_kernel(w_desc, x_desc, d_ptr, sd_ptr, sa_ptr, colscale_ptr, masked_m_ptr, max_m, N, K,
                                 stride_sa, stride_d_g, stride_d_m, STAGES: gl.constexpr,
                                 TOKENS_FASTEST: gl.constexpr):
    """d[g, m, n] = colscale[g, n] * sum over 32-blocks kb of sa[g, m, kb] * (x[g, m, kb] . w'[g, n, kb]) for
    m < masked_m[g]. w_desc: packed weights uint8 [G * N, K / 2] in [128, 64] boxes (RAW_LAYOUT); x_desc: e4m3
    [G * max_m, K] in [BLOCK_M, 128] boxes; sd_ptr: int32 words of the offset bytes d + 5 [G * N, K / 128]; sa_ptr:
    int32 words of the UE8M0 bytes [G * max_m, K / 32] (row stride stride_sa words); colscale fp32 [G * N]; d bf16
    [G, max_m, N]. N % 128 == 0, K % 128 == 0. Grid (N / 128, G, cdiv(max_m, BLOCK_M)), num_warps=4; with
    TOKENS_FASTEST (cdiv(max_m, BLOCK_M), N / 128, G), so that the token tiles of one weight tile run side by side
    and read its bytes from L2 once one of them has brought them from memory."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, 128, 64], w_desc.layout)
    raw_words = w_ring._reinterpret(gl.int32, [STAGES, 128, 16],
                                    gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2))
    x_ring = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, 128], x_desc.layout)
    w_tile = gl.allocate_shared_memory(gl.int32, [128, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    w_e4m3 = w_tile._reinterpret(x_desc.dtype, [128, 128],
                                 gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)

    if TOKENS_FASTEST:
        m0 = gl.program_id(0) * BLOCK_M
        n0 = gl.program_id(1) * 128
        g = gl.program_id(2)
    else:
        n0 = gl.program_id(0) * 128
        g = gl.program_id(1)
        m0 = gl.program_id(2) * BLOCK_M
    rows_used = gl.load(masked_m_ptr + g)
    if m0 < rows_used:
        num_k = K // 128
        w_row = g * N + n0
        x_row = g * max_m + m0
        for s in gl.static_range(STAGES - 1):
            if s < num_k:
                _issue(w_desc, x_desc, w_ring, x_ring, ready, s, w_row, x_row)

        words: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [4, 1], [1, 0])  # a thread: one weight row
        col = gl.arange(0, 16, layout=gl.SliceLayout(0, words))[None, :]
        for_k32 = col // 4  # the word's 32-block of the step: a constant of its register, so the selects fold
        sd_rows = sd_ptr + (w_row + gl.arange(0, 128, layout=gl.SliceLayout(1, words))).to(gl.int64) * (K // 128)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 32])
        tokens = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        sa_cols = sa_ptr + (g * max_m + gl.minimum(tokens, max_m - 1)).to(gl.int64) * stride_sa
        zero = gl.zeros([64, BLOCK_M], gl.float32, mma)
        acc_lo = gl.zeros([64, BLOCK_M], gl.float32, mma)
        acc_hi = gl.zeros([64, BLOCK_M], gl.float32, mma)
        sd, wa = gl.load(sd_rows), gl.load(sa_cols)
        for k in range(num_k):
            # the slot read in step k - 1 is free (its MMAs were waited for): refill it a ring ahead
            if k + STAGES - 1 < num_k:
                _issue(w_desc, x_desc, w_ring, x_ring, ready, k + STAGES - 1, w_row, x_row)
            ahead = gl.minimum(k + 1, num_k - 1)
            sd_next, wa_next = gl.load(sd_rows + ahead), gl.load(sa_cols + ahead)
            lo0 = LUT_LO_BASE + (sd & 0xFF) * LUT_LO_STEP
            lo1 = LUT_LO_BASE + ((sd >> 8) & 0xFF) * LUT_LO_STEP
            lo2 = LUT_LO_BASE + ((sd >> 16) & 0xFF) * LUT_LO_STEP
            lo3 = LUT_LO_BASE + ((sd >> 24) & 0xFF) * LUT_LO_STEP
            hi0 = LUT_HI_BASE + (sd & 0xFF) * LUT_HI_STEP
            hi1 = LUT_HI_BASE + ((sd >> 8) & 0xFF) * LUT_HI_STEP
            hi2 = LUT_HI_BASE + ((sd >> 16) & 0xFF) * LUT_HI_STEP
            hi3 = LUT_HI_BASE + ((sd >> 24) & 0xFF) * LUT_HI_STEP
            lo = gl.where(for_k32 == 0, lo0[:, None], gl.where(for_k32 == 1, lo1[:, None],
                                                               gl.where(for_k32 == 2, lo2[:, None], lo3[:, None])))
            hi = gl.where(for_k32 == 0, hi0[:, None], gl.where(for_k32 == 1, hi1[:, None],
                                                               gl.where(for_k32 == 2, hi2[:, None], hi3[:, None])))
            slot = k % STAGES
            mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
            w = raw_words.index(slot).load(words)
            q03, q47 = gl.inline_asm_elementwise(_E2M1_TO_E4M3_PTX, "=r,=r,r,r,r", [w, lo, hi],
                                                 dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
            w_tile.store(gl.reshape(gl.join(q03, q47), [128, 32]))
            fence_async_shared()
            gl.thread_barrier()  # every thread's part of the tile is written before the MMAs read it
            x_tile = x_ring.index(slot)
            for j in gl.static_range(4):
                b = x_tile.slice(32 * j, 32, dim=1).permute((1, 0))
                lo_mma = warpgroup_mma(w_e4m3.slice(0, 64, dim=0).slice(32 * j, 32, dim=1), b, zero, use_acc=False,
                                       is_async=True)
                hi_mma = warpgroup_mma(w_e4m3.slice(64, 64, dim=0).slice(32 * j, 32, dim=1), b, zero, use_acc=False,
                                       is_async=True)
                part_lo, part_hi = warpgroup_mma_wait(0, deps=(lo_mma, hi_mma))
                fa = _ue8m0_to_f32((wa >> (8 * j)) & 0xFF)[None, :]
                acc_lo = acc_lo + part_lo * fa
                acc_hi = acc_hi + part_hi * fa
            sd, wa = sd_next, wa_next
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
        keep = (tokens < rows_used)[None, :]
        out = d_ptr + g.to(gl.int64) * stride_d_g + tokens.to(gl.int64)[None, :] * stride_d_m
        scale_lo = gl.load(colscale_ptr + w_row + rows)[:, None]
        scale_hi = gl.load(colscale_ptr + w_row + 64 + rows)[:, None]
        gl.store(out + (n0 + rows)[:, None], (acc_lo * scale_lo).to(gl.bfloat16), mask=keep)
        gl.store(out + (n0 + 64 + rows)[:, None], (acc_hi * scale_hi).to(gl.bfloat16), mask=keep)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))


def fp8_fp4_masked_fp8mma(a: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, folded, masked_m: torch.Tensor,
                          d: torch.Tensor, block_m: int, stages: int = 2, maxnreg: int | None = None,
                          tokens_fastest: bool = False) -> None:
    """d = the masked grouped GEMM of e4m3 a [G, max_m, K] (UE8M0 sa [G, max_m, K / 32]) and packed e2m1 bq
    [G, N, K / 2] with exp_gemm_fp8_moe.fold_weight_scales' `folded`; block_m tokens per tile; maxnreg: a register
    cap for more resident CTAs (None: ptxas's choice)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mini_deepgemm import gemm as G
    from mini_deepgemm._backend import cdiv

    G_, max_m, K = a.shape
    N = bq.shape[1]
    sd, colscale = folded
    w_desc = TensorDescriptor.from_tensor(bq.view(G_ * N, K // 2), [128, 64], RAW_LAYOUT)
    grid = (cdiv(max_m, block_m), N // 128, G_) if tokens_fastest else (N // 128, G_, cdiv(max_m, block_m))
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    fp8_fp4_masked_fp8mma_kernel[grid](
        w_desc, G._tma_desc(a.view(G_ * max_m, K), (block_m, 128)), d, sd, sa.view(torch.uint8).view(torch.int32),
        colscale, masked_m, max_m, N, K, K // 128, d.stride(0), d.stride(1), STAGES=stages,
        TOKENS_FASTEST=tokens_fastest, num_warps=4, **extra)


# (tokens per tile, ring stages, register cap, token tiles fastest) timed per case. Run 8 measured (16, 6) and
# (64, 6), whose 78 / 115 KB of shared memory (and 255 registers at 64 tokens) leave 2 CTAs per SM; run 9 found 2
# stages best at every tile (16 tokens: 97 registers, so 5 CTAs per SM; 80 would give 6).
TILE_VARIANTS = {8: ((16, 2, None, False), (16, 2, 80, False), (16, 3, 80, False), (16, 2, None, True)),
                 32: ((16, 2, None, True), (16, 2, 80, True), (32, 2, None, False), (32, 2, None, True),
                      (64, 2, None, False))}


def as_contiguous(a: torch.Tensor, sa: torch.Tensor, masked: torch.Tensor):
    """The masked case's used rows in the contiguous layout (each expert's segment padded to 128 rows with -1):
    (a, sa, layout, index of each used masked row in it)."""
    segments, rows = [], []
    for g, m in enumerate(masked.tolist()):
        start = sum(segments)
        rows += [start + i for i in range(m)]
        segments.append(-(-m // 128) * 128)
    layout = torch.full((sum(segments),), -1, dtype=torch.int32)
    for g, m in enumerate(masked.tolist()):
        layout[sum(segments[:g]): sum(segments[:g]) + m] = g
    where = torch.tensor(rows, device="cuda")
    used = torch.arange(a.shape[1])[None, :] < masked[:, None]
    a_c = torch.zeros(layout.numel(), a.shape[2], device="cuda").to(torch.float8_e4m3fn)
    sa_c = torch.full((layout.numel(), sa.shape[2]), 127, dtype=torch.uint8, device="cuda")
    a_c[where] = a[used.cuda()]
    sa_c[where] = sa.view(torch.uint8)[used.cuda()]
    return a_c, sa_c.view(torch.float8_e8m0fnu), layout.cuda(), where


def smoke(queue) -> None:
    """Small ragged cases (in a child: a hang would not stop the run): against the reference, unused rows left
    untouched, and every used row bitwise against exp_gemm_fp8_moe's contiguous kernel on the same rows (the two
    kernels put the operands on opposite sides of the MMA: does the tensor core give A.B and B.A the same bits?)."""
    from bench_deepgemm import masked_operands
    from exp_gemm_fp8_moe import fp8_fp4_contiguous_fp8mma
    from mini_deepgemm import reference
    from mini_deepgemm.testing import calc_diff

    gen = torch.Generator().manual_seed(3)
    out = {}
    for expected_m in (8, 32):
        masked, masked_m, (a, sa), (bq, _), d = masked_operands(4, expected_m, 384, 512, gen, max_m=96)
        sb = torch.randint(118, 129, (4, 384, 16), dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)
        folded = fold_weight_scales(sb)
        d.zero_()
        # 16-token tiles; at ~32 rows an expert spans several, in the token-fastest grid
        fp8_fp4_masked_fp8mma(a, sa, bq, folded, masked_m, d, 16, tokens_fastest=expected_m == 32)
        ref = reference.m_grouped_gemm_nt_masked_ref(a, sa, bq, sb, masked_m, 1, 32)
        used = torch.arange(96, device="cuda")[None, :] < masked_m[:, None]
        out[f"diff_vs_reference_m{expected_m}"] = float(calc_diff(d[used].float(), ref[used].float()))
        out[f"unused_rows_untouched_m{expected_m}"] = bool((d[~used] == 0).all())
        a_c, sa_c, layout, where = as_contiguous(a, sa, masked)
        d_c = torch.empty(layout.numel(), 384, dtype=torch.bfloat16, device="cuda")
        fp8_fp4_contiguous_fp8mma(a_c, sa_c, bq, folded, layout, d_c)
        out[f"bitwise_vs_contiguous_m{expected_m}"] = bool(torch.equal(d[used].view(torch.int16),
                                                                       d_c[where].view(torch.int16)))
    queue.put(out)


def main() -> None:
    from bench_deepgemm import FP4_SCALE_BOUND, copy_bandwidth_gbs, masked_operands
    from bench_flashmla import environment
    from exp_gemm_gluon_v3 import ms, smoke_in_child
    from mini_deepgemm import gemm as G
    from mini_deepgemm.testing import calc_diff

    first = smoke_in_child(smoke, 150, "the FP8-MMA masked kernel's smoke cases")
    print("smoke:", first, flush=True)
    result = {"environment": environment(torch.device("cuda")), "smoke": first, "rows": []}
    copy_gbs = copy_bandwidth_gbs()
    torch.cuda.empty_cache()
    gen = torch.Generator().manual_seed(0)
    for expected_m in (8, 32):
        for name, N, K in (("w13", 4608, 5120), ("w2", 5120, 2304)):
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K, gen)
            sb = torch.randint(118, 129, (96, N, K // 32), dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)
            folded = fold_weight_scales(sb)
            cfg = G.default_config(G._MASKED, expected_m, 32, True, n=N, groups=96, fp4=True)
            d_ship = torch.zeros_like(d)
            t = {f"fp8mma_b{bm}_s{st}_r{reg or 0}{'_tf' if tf else ''}": ms(
                lambda: fp8_fp4_masked_fp8mma(a, sa, bq, folded, masked_m, d, bm, st, reg, tf))
                for bm, st, reg, tf in TILE_VARIANTS[expected_m]}
            best = min(t, key=t.get)
            t["fp8mma"] = t[best]
            t["shipped"] = ms(lambda: G._gemm(G._MASKED, (a, sa), (bq, sb), d_ship, None, masked_m, None, True,
                                              expected_m=expected_m, config=cfg, weight_scale_max=FP4_SCALE_BOUND))
            used = torch.arange(128, device="cuda")[None, :] < masked_m[:, None]
            weight_bytes = bq.numel() + sb.numel()
            row = {"expected_m": expected_m, "name": name, "N": N, "K": K, "rows": int(masked.sum()), "best": best,
                   "copy_gbs": copy_gbs, "diff_vs_shipped": float(calc_diff(d[used].float(), d_ship[used].float()))}
            for k_, v in t.items():
                row[f"us_{k_}"] = v * 1e3
                row[f"frac_of_copy_{k_}"] = weight_bytes / v / 1e6 / copy_gbs
            row["speedup_vs_shipped"] = t["shipped"] / t["fp8mma"]
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    print(f"| expected rows | GEMM | best tile (tokens, stages) | us fp8mma | us shipped | of copy ({copy_gbs:.0f} "
          "GB/s): fp8mma | shipped | speed-up | diff vs shipped |")
    for r in result["rows"]:
        print(f"| {r['expected_m']} | {r['name']} | {r['best']} | {r['us_fp8mma']:.0f} | {r['us_shipped']:.0f} | "
              f"{r['frac_of_copy_fp8mma']:.2f} | {r['frac_of_copy_shipped']:.2f} | {r['speedup_vs_shipped']:.2f} | "
              f"{r['diff_vs_shipped']:.1e} |")
    with open(os.path.join(os.environ.get("OUT", "."), "exp_gemm_fp8_masked.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
