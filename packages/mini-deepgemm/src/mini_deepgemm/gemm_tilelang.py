"""TileLang kernels for the FP8 / FP8 x FP4 NT GEMMs with fine-grained scales (SM90), after DeepGEMM's design.

Why a second backend: Triton 3.6 waits for every `tl.dot` before the next instruction, so the promotion of
a scale group's partial product (fp32 FMAs on the CUDA cores) never overlaps an MMA (see
docs/reports/deepgemm-scaling.md). TileLang warp-specializes the kernel: one producer warpgroup issues the
TMA loads, two consumer warpgroups each issue their own WGMMAs and promote their own partial, so one
consumer's promotion can run while the other's MMA occupies the tensor cores.

Measured on H200 (docs/reports/deepgemm-tilelang.md): as written this is no faster than the Triton kernel
(V3 recipe within +-10% of it, V4.1 recipe equal, FP4 weights 3.5-4.6x slower), so gemm.py routes nothing
here by default; the report says where the time goes and what to change next.

Per CTA (BLOCK_M x BLOCK_N output tile, one scale group of K per pipeline stage):
- A [BLOCK_M, gran_k] e4m3 and B [BLOCK_N, gran_k] e4m3 (or packed e2m1 [BLOCK_N, gran_k/2]) arrive by TMA;
- packed FP4 B is rewritten as e4m3 bytes in shared memory by the consumers (exact: e2m1 is a subset of e4m3);
- one FP8 WGMMA into a cleared fp32 partial, then acc += partial * (sa[row] * sb[col]) on the CUDA cores
  (the "promotion"), with the scales of the group loaded into registers one group ahead.
The products are exact and accumulate in fp32, so the result differs from `reference.gemm_nt_ref` only in
the order of additions (and the WGMMA's internal accumulation within one group).

Coverage (everything else stays on the Triton kernel, see gemm.py's dispatch):
- layouts: dense and M-grouped contiguous (expert id of a tile = grouped_layout of its first row; rows
  whose id is -1 are not written);
- weights: FP8 (gran_n 32 or 128) or packed FP4 (gran_n 1); scales UE8M0 (uint8 exponents) or fp32;
- bf16 output without accumulate-into; K a multiple of 128.
tilelang is optional: import this module only when `tilelang_importable()`.
"""

import functools  # no `from __future__ import annotations`: TileLang evaluates the kernel's annotations

import tilelang
import tilelang.language as T
import torch

K_ALIGN = 128  # K must be a multiple of this (the V3 scale group and the FP4 16-byte TMA rows)
DENSE, CONTIGUOUS = 0, 1


@functools.cache
def _kernel(layout: int, b_fp4: bool, ue8m0: bool, gran_n: int, gran_k: int,
            block_m: int, block_n: int, num_stages: int):
    """Compile one kernel variant; M, N, K (and G) are dynamic, so one compile serves every shape.

    One pipeline stage = one scale group of K (gran_k), so every WGMMA is followed by one promotion. The
    consumers load the next group's scales from global memory into registers before the current group's
    MMA (a T.copy of the scales through shared memory turns the producer into a 256-thread plain-load
    warpgroup and drops the consumers' register reallocation). One group ahead is too short to hide that
    load at 32-wide groups, and row-major scales make each warp load touch 8 sectors for 8 useful bytes:
    see the report."""
    M, N, K, G = T.dynamic("M, N, K, G")
    fp8, f32 = "float8_e4m3fn", "float32"
    s_dtype = "uint8" if ue8m0 else f32
    b_cols, b_stage_cols = (K // 2, gran_k // 2) if b_fp4 else (K, gran_k)
    b_dtype = "uint8" if b_fp4 else fp8
    grouped = layout == CONTIGUOUS
    b_shape = (G, N, b_cols) if grouped else (N, b_cols)
    sb_shape = (G, T.ceildiv(N, gran_n), K // gran_k) if grouped else (T.ceildiv(N, gran_n), K // gran_k)
    gl_shape = (M,) if grouped else (1,)

    def to_f32(s):
        """UE8M0 exponent byte -> 2^(e-127) by placing it in the fp32 exponent field; fp32 scales as they are."""
        return T.reinterpret(T.shift_left(T.Cast("int32", s), 23), f32) if ue8m0 else s

    def e2m1_to_e4m3(nib):
        """e2m1 code (sign bit 3) -> the e4m3 byte of the same value: 0.5 -> 0x30, codes c >= 2 -> 4c + 0x30."""
        mag = T.bitwise_and(nib, 7)
        body = T.if_then_else(mag >= 2, T.shift_left(mag, 2) + 0x30, T.if_then_else(mag == 1, 0x30, 0))
        return T.Cast("uint8", T.bitwise_or(body, T.shift_left(T.bitwise_and(nib, 8), 4)))

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), fp8),
        SA: T.Tensor((M, K // gran_k), s_dtype),
        B: T.Tensor(b_shape, b_dtype),
        SB: T.Tensor(sb_shape, s_dtype),
        D: T.Tensor((M, N), "bfloat16"),
        GL: T.Tensor(gl_shape, "int32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_m, gran_k), fp8)
            B_s = T.alloc_shared((block_n, b_stage_cols), b_dtype)
            B8_s = T.alloc_shared((block_n, gran_k), fp8) if b_fp4 else B_s
            D_s = T.alloc_shared((block_m, block_n), "bfloat16")
            partial = T.alloc_fragment((block_m, block_n), f32)
            acc = T.alloc_fragment((block_m, block_n), f32)
            sa = T.alloc_fragment((block_m,), f32)
            sb = T.alloc_fragment((block_n,), f32)
            sa_next = T.alloc_fragment((block_m,), f32)
            sb_next = T.alloc_fragment((block_n,), f32)
            T.use_swizzle(8)
            T.clear(acc)
            g = T.max(GL[by * block_m], 0) if grouped else 0
            groups = K // gran_k
            for i in T.Parallel(block_m):
                sa_next[i] = to_f32(SA[by * block_m + i, 0])
            for j in T.Parallel(block_n):
                if grouped:
                    sb_next[j] = to_f32(SB[g, (bx * block_n + j) // gran_n, 0])
                else:
                    sb_next[j] = to_f32(SB[(bx * block_n + j) // gran_n, 0])
            for k in T.Pipelined(groups, num_stages=num_stages):
                T.copy(A[by * block_m, k * gran_k], A_s)
                if grouped:
                    T.copy(B[g, bx * block_n, k * b_stage_cols], B_s)
                else:
                    T.copy(B[bx * block_n, k * b_stage_cols], B_s)
                if b_fp4:
                    for n, kk in T.Parallel(block_n, gran_k):
                        B8_s[n, kk] = T.reinterpret(
                            e2m1_to_e4m3(T.shift_right(T.Cast("int32", B_s[n, kk // 2]), (kk % 2) * 4)), fp8)
                for i in T.Parallel(block_m):
                    sa[i] = sa_next[i]
                for j in T.Parallel(block_n):
                    sb[j] = sb_next[j]
                kn = T.min(k + 1, groups - 1)
                for i in T.Parallel(block_m):
                    sa_next[i] = to_f32(SA[by * block_m + i, kn])
                for j in T.Parallel(block_n):
                    if grouped:
                        sb_next[j] = to_f32(SB[g, (bx * block_n + j) // gran_n, kn])
                    else:
                        sb_next[j] = to_f32(SB[(bx * block_n + j) // gran_n, kn])
                T.gemm(A_s, B8_s, partial, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(block_m, block_n):
                    acc[i, j] += partial[i, j] * (sa[i] * sb[j])
            T.copy(acc, D_s)
            if grouped:
                for i, j in T.Parallel(block_m, block_n):
                    if by * block_m + i < M and bx * block_n + j < N:
                        if GL[by * block_m + i] >= 0:
                            D[by * block_m + i, bx * block_n + j] = D_s[i, j]
            else:
                T.copy(D_s, D[by * block_m, bx * block_n])

    return tilelang.compile(gemm, out_idx=None, target={"kind": "cuda", "arch": "sm_90a"})


def supports(layout: int, b_fp4: bool, gran_n: int, gran_k: int, K: int, d: torch.Tensor,
             c: torch.Tensor | None) -> bool:
    """True when this backend covers the call (see the module docstring)."""
    return (layout in (DENSE, CONTIGUOUS) and c is None and d.dtype == torch.bfloat16 and K % K_ALIGN == 0
            and gran_k in (32, 128) and (gran_n in (32, 128) or (b_fp4 and gran_n == 1)))


def default_tiles(gran_k: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, stages). Two consumer warpgroups share a 128 x 128 tile; each thread holds 64 fp32
    registers of partial and 64 of accumulator (168 registers in all, no spills). A stage is one scale group,
    so 32-wide groups need more stages in flight to cover the TMA latency."""
    return (128, 128, 5) if gran_k == 128 else (128, 128, 12)


def launch(layout: int, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
           d: torch.Tensor, grouped_layout: torch.Tensor | None, gran_n: int, gran_k: int, b_fp4: bool,
           tiles: tuple[int, int, int] | None = None) -> None:
    """Run the kernel on validated operands (gemm._validate) with `supports(...)` true."""
    (aq, sa), (bq, sb) = a, b
    ue8m0 = sa.dtype != torch.float32
    if ue8m0:
        sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    if b_fp4:
        bq = bq.view(torch.uint8)
    block_m, block_n, stages = tiles or default_tiles(gran_k)
    kernel = _kernel(layout, b_fp4, ue8m0, gran_n, gran_k, block_m, block_n, stages)
    gl = grouped_layout if grouped_layout is not None else _unused_layout(d.device)
    kernel(aq, sa.contiguous(), bq, sb.contiguous(), d, gl)


@functools.cache
def _unused_layout(device: torch.device) -> torch.Tensor:
    """The dense kernel's grouped_layout argument (never read), allocated once per device, not per call."""
    return torch.zeros(1, dtype=torch.int32, device=device)


__all__ = ["supports", "launch", "default_tiles"]
