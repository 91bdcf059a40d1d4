"""TileLang kernels for the FP8 / FP8 x FP4 NT GEMMs with fine-grained scales (SM90), DeepGEMM's design.

Why a second backend: Triton 3.6 waits for every `tl.dot` before the next instruction, so the promotion of
a scale group's partial product (fp32 FMAs on the CUDA cores) never overlaps an MMA (see
docs/reports/deepgemm-scaling.md). TileLang warp-specializes the kernel: one producer warpgroup issues the
TMA loads, two consumer warpgroups each issue their own WGMMAs and promote their own partial, so one
consumer's promotion runs while the other's MMA occupies the tensor cores.

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
FP4_SWAPPED = True  # FP4 weights: the operand-swapped kernel (see `_kernel_fp4_swapped`)


@functools.cache
def _kernel(layout: int, b_fp4: bool, ue8m0: bool, gran_n: int, gran_k: int,
            block_m: int, block_n: int, num_stages: int):
    """Compile one kernel variant; M, N, K (and G) are dynamic, so one compile serves every shape.

    One pipeline stage = one scale group of K (gran_k): every WGMMA is followed by one promotion. The scales
    travel with the operands: the producer loads the stage's A scales (one per row) and B scales (one per
    column block) by TMA from MN-major copies (see `_mn_major`), so the consumers read them from shared
    memory instead of waiting on global loads. Each consumer warpgroup owns 64 full rows of the tile
    (FullRow), so its WGMMAs are m64 x BLOCK_N, the widest shape, and it promotes only its own rows."""
    M, N, K, G, MP, NBP = T.dynamic("M, N, K, G, MP, NBP")
    fp8, f32 = "float8_e4m3fn", "float32"
    s_dtype = "uint8" if ue8m0 else f32
    s_bytes = 1 if ue8m0 else 4
    b_cols, b_stage_cols = (K // 2, gran_k // 2) if b_fp4 else (K, gran_k)
    b_dtype = "uint8" if b_fp4 else fp8
    grouped = layout == CONTIGUOUS
    groups = K // gran_k
    b_shape = (G, N, b_cols) if grouped else (N, b_cols)
    sb_shape = (G, groups, NBP) if grouped else (groups, NBP)
    gl_shape = (M,) if grouped else (1,)
    sb_tile = block_n // gran_n if gran_n < block_n else 1  # B scales one tile uses per group
    # Every stage's copy of a TMA box must start 128-byte aligned in shared memory (16-byte stages failed
    # with "misaligned address"), so a box is at least 128 bytes; the part past the tile is not read.
    sb_box = max(sb_tile, 128 // s_bytes)

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
        SA: T.Tensor((groups, MP), s_dtype),
        B: T.Tensor(b_shape, b_dtype),
        SB: T.Tensor(sb_shape, s_dtype),
        D: T.Tensor((M, N), "bfloat16"),
        GL: T.Tensor(gl_shape, "int32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_m, gran_k), fp8)
            B_s = T.alloc_shared((block_n, b_stage_cols), b_dtype)
            B8_s = T.alloc_shared((block_n, gran_k), fp8) if b_fp4 else B_s
            SA_s = T.alloc_shared((1, block_m), s_dtype)
            SB_s = T.alloc_shared((1, sb_box), s_dtype)
            D_s = T.alloc_shared((block_m, block_n), "bfloat16")
            partial = T.alloc_fragment((block_m, block_n), f32)
            acc = T.alloc_fragment((block_m, block_n), f32)
            sa = T.alloc_fragment((block_m,), f32)
            sb = T.alloc_fragment((block_n,), f32)
            T.use_swizzle(8)
            T.clear(acc)
            g = T.max(GL[by * block_m], 0) if grouped else 0
            for k in T.Pipelined(groups, num_stages=num_stages):
                T.copy(A[by * block_m, k * gran_k], A_s)
                T.copy(SA[k, by * block_m], SA_s)
                if grouped:
                    T.copy(B[g, bx * block_n, k * b_stage_cols], B_s)
                    T.copy(SB[g, k, bx * block_n // gran_n], SB_s)
                else:
                    T.copy(B[bx * block_n, k * b_stage_cols], B_s)
                    T.copy(SB[k, bx * block_n // gran_n], SB_s)
                if b_fp4:
                    for n, kk in T.Parallel(block_n, gran_k):
                        B8_s[n, kk] = T.reinterpret(
                            e2m1_to_e4m3(T.shift_right(T.Cast("int32", B_s[n, kk // 2]), (kk % 2) * 4)), fp8)
                T.gemm(A_s, B8_s, partial, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i in T.Parallel(block_m):
                    sa[i] = to_f32(SA_s[0, i])
                for j in T.Parallel(block_n):
                    sb[j] = to_f32(SB_s[0, j // gran_n])
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


@functools.cache
def _kernel_fp4_swapped(layout: int, block_m: int, block_n: int, num_stages: int):
    """FP8 x packed-FP4 variant with the operands swapped: the tile is computed as D^T, the weights being the
    WGMMA's A operand taken from registers. Each consumer warpgroup unpacks its own 64 weight rows straight
    into the register fragment the WGMMA reads, so the e2m1 -> e4m3 rewrite needs no shared-memory round
    trip and no barrier between the two warpgroups (the plain kernel writes one converted tile that both
    read). Scales: UE8M0, 1 x 32 on both sides (FP4_RECIPE)."""
    M, N, K, G, MP, NP = T.dynamic("M, N, K, G, MP, NP")
    fp8, f32 = "float8_e4m3fn", "float32"
    gran_k = 32
    grouped = layout == CONTIGUOUS
    groups = K // gran_k
    b_shape = (G, N, K // 2) if grouped else (N, K // 2)
    sb_shape = (G, groups, NP) if grouped else (groups, NP)
    gl_shape = (M,) if grouped else (1,)

    def to_f32(s):
        return T.reinterpret(T.shift_left(T.Cast("int32", s), 23), f32)

    def e2m1_to_e4m3(nib):
        mag = T.bitwise_and(nib, 7)
        body = T.if_then_else(mag >= 2, T.shift_left(mag, 2) + 0x30, T.if_then_else(mag == 1, 0x30, 0))
        return T.Cast("uint8", T.bitwise_or(body, T.shift_left(T.bitwise_and(nib, 8), 4)))

    @T.prim_func
    def gemm(
        A: T.Tensor((M, K), fp8),
        SA: T.Tensor((groups, MP), "uint8"),
        B: T.Tensor(b_shape, "uint8"),
        SB: T.Tensor(sb_shape, "uint8"),
        D: T.Tensor((M, N), "bfloat16"),
        GL: T.Tensor(gl_shape, "int32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_m, gran_k), fp8)
            B_s = T.alloc_shared((block_n, gran_k // 2), "uint8")
            SA_s = T.alloc_shared((1, block_m), "uint8")
            SB_s = T.alloc_shared((1, block_n), "uint8")
            D_s = T.alloc_shared((block_m, block_n), "bfloat16")
            b8 = T.alloc_fragment((block_n, gran_k), fp8)
            partial = T.alloc_fragment((block_n, block_m), f32)
            acc = T.alloc_fragment((block_n, block_m), f32)
            sa = T.alloc_fragment((block_m,), f32)
            sb = T.alloc_fragment((block_n,), f32)
            T.use_swizzle(8)
            T.clear(acc)
            g = T.max(GL[by * block_m], 0) if grouped else 0
            for k in T.Pipelined(groups, num_stages=num_stages):
                T.copy(A[by * block_m, k * gran_k], A_s)
                T.copy(SA[k, by * block_m], SA_s)
                if grouped:
                    T.copy(B[g, bx * block_n, k * (gran_k // 2)], B_s)
                    T.copy(SB[g, k, bx * block_n], SB_s)
                else:
                    T.copy(B[bx * block_n, k * (gran_k // 2)], B_s)
                    T.copy(SB[k, bx * block_n], SB_s)
                for n, kk in T.Parallel(block_n, gran_k):
                    b8[n, kk] = T.reinterpret(
                        e2m1_to_e4m3(T.shift_right(T.Cast("int32", B_s[n, kk // 2]), (kk % 2) * 4)), fp8)
                T.gemm(b8, A_s, partial, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i in T.Parallel(block_m):
                    sa[i] = to_f32(SA_s[0, i])
                for j in T.Parallel(block_n):
                    sb[j] = to_f32(SB_s[0, j])
                for j, i in T.Parallel(block_n, block_m):
                    acc[j, i] += partial[j, i] * (sb[j] * sa[i])
            for j, i in T.Parallel(block_n, block_m):
                D_s[i, j] = acc[j, i]
            if grouped:
                for i, j in T.Parallel(block_m, block_n):
                    if by * block_m + i < M and bx * block_n + j < N:
                        if GL[by * block_m + i] >= 0:
                            D[by * block_m + i, bx * block_n + j] = D_s[i, j]
            else:
                T.copy(D_s, D[by * block_m, bx * block_n])

    return tilelang.compile(gemm, out_idx=None, target={"kind": "cuda", "arch": "sm_90a"})


def _mn_major(s: torch.Tensor, rows: int) -> torch.Tensor:
    """[..., rows, groups] scales -> [..., groups, rows_padded]: what one TMA box per stage reads (one scale
    group of BLOCK rows); rows padded so each row of the copy is a multiple of 16 bytes, as TMA needs.
    Costs one small copy per call (DeepGEMM asks its callers for this layout instead)."""
    pad = -rows % (16 // s.element_size())
    out = torch.empty(*s.shape[:-2], s.shape[-1], rows + pad, dtype=s.dtype, device=s.device)
    out[..., :rows].copy_(s.transpose(-1, -2))
    return out


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
           tiles: tuple[int, int, int] | None = None, fp4_swapped: bool = FP4_SWAPPED) -> None:
    """Run a kernel on validated operands (gemm._validate) with `supports(...)` true. fp4_swapped picks the
    kernel for FP4 weights (`_kernel_fp4_swapped`, or the plain kernel converting through shared memory)."""
    (aq, sa), (bq, sb) = a, b
    ue8m0 = sa.dtype != torch.float32
    if ue8m0:
        sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    if b_fp4:
        bq = bq.view(torch.uint8)
    block_m, block_n, stages = tiles or default_tiles(gran_k)
    if b_fp4 and fp4_swapped:
        kernel = _kernel_fp4_swapped(layout, block_m, block_n, stages)
    else:
        kernel = _kernel(layout, b_fp4, ue8m0, gran_n, gran_k, block_m, block_n, stages)
    gl = grouped_layout if grouped_layout is not None else _unused_layout(d.device)
    kernel(aq, _mn_major(sa, sa.shape[-2]), bq, _mn_major(sb, sb.shape[-2]), d, gl)


@functools.cache
def _unused_layout(device: torch.device) -> torch.Tensor:
    """The dense kernel's grouped_layout argument (never read), allocated once per device, not per call."""
    return torch.zeros(1, dtype=torch.int32, device=device)


__all__ = ["supports", "launch", "default_tiles"]
