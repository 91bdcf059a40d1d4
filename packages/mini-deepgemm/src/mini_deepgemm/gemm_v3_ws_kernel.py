"""Triton kernel of the dense V3-recipe FP8 GEMM on TMA loads, its K loop warp-specialized by triton's Hopper pass.

Where it runs: the Triton route on Hopper (a uv-locked install, whose triton is not 3.6, or MINI_DEEPGEMM_GLUON=0),
for the dense GEMMs of fp32 scales per 1 x 128 and 128 x 128, which include every V4.1 projection the engine folds
into that recipe (gemm._use_v3_ws). The Gluon route has its own kernel for these (gemm_gluon_fp8_kernel).

Why: the Triton route's dense V3 kernel (gemm_kernel.scaled_gemm_nt_kernel, 64 x 128 tiles) loads its operands with
pointer loads and runs its promotion and the next step's loads in one instruction stream. The Gluon kernel's lead
over it was its TMA producer warp (docs/reports/triton-route-on-hopper.md). triton 3.6 and 3.9 both carry a Hopper
warp-specialization pass (`tl.range(..., warp_specialize=True)`; the docstring names Blackwell only, but
`make_ttgir` runs it on sm_90): on a loop whose dot operands come from tensor descriptors it makes a producer
warpgroup that issues the TMA copies (40 registers) and consumer warpgroups that own the MMAs and promotions
(232 registers), with mbarrier rings between them. It rejects pointer loads that feed a dot, a dot operand converted
in registers, and an early return (offline, session 78), so this kernel has none of them; the scales' small pointer
loads stay in the consumers.

How: one program per output tile; per 128 of K one FP8 dot into a fresh fp32 tile, promoted into the accumulator by
sa[m] * sb[n // 128], the same arithmetic in the same order as scaled_gemm_nt_kernel at BLOCK_K = 128, so the two
give the same bits. Out-of-range rows and columns of a tile are zero-filled by the TMA and masked at the store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .gemm_kernel import grouped_tile


@triton.jit
def fp8_gemm_v3_ws_kernel(a_desc, sa_ptr, b_desc, sb_ptr, d_ptr, c_ptr, M, N, K, stride_sa_m, stride_sb_n, stride_d_m,
                          HAS_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                          STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """d[M, N] = (a * sa) @ (b * sb)^T (+ c). a: e4m3 [M, K] and b: e4m3 [N, K] as tensor descriptors of [BLOCK_M,
    128] and [BLOCK_N, 128] boxes; sa fp32 [M, K / 128] and sb fp32 [cdiv(N, 128), K / 128], unit stride along K;
    d bf16 or fp32 [M, N] (c: fp32, d's strides)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    sa_ptrs = sa_ptr + (offs_m % M).to(tl.int64) * stride_sa_m  # wrapped rows: any valid scale, their output is masked
    sb_ptrs = sb_ptr + ((offs_n % N) // 128).to(tl.int64) * stride_sb_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.range(0, K // 128, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        a = a_desc.load([pid_m * BLOCK_M, 128 * step])
        b = b_desc.load([pid_n * BLOCK_N, 128 * step])
        partial = tl.dot(a, tl.trans(b))
        acc += partial * (tl.load(sa_ptrs + step)[:, None] * tl.load(sb_ptrs + step)[None, :])
    out_offs = offs_m.to(tl.int64)[:, None] * stride_d_m + offs_n[None, :]
    out_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if HAS_C:
        acc += tl.load(c_ptr + out_offs, mask=out_mask, other=0.0)
    tl.store(d_ptr + out_offs, acc.to(d_ptr.dtype.element_ty), mask=out_mask)
