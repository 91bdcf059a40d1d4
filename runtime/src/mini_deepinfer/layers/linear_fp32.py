"""fp32 linears of bf16 operands: out fp32 [T, N] = x @ w^T for bf16 x [T, D] and a bf16 weight [N, D]. The model
has two: the output head (logits, N = vocabulary) and the MoE gate (router scores, N = experts).

The reference (ops.py, V41_MODEL.md section 2) computes `x.float() @ w.float().T`. Every product of two bf16 values
is exact in fp32 (8 x 8 significand bits), so a bf16 tensor-core GEMM with fp32 accumulation and fp32 output
computes the same sums, in another order. `linear_fp32` does that on CUDA with a Triton kernel.

Why: the reference's form writes an fp32 copy of the weight at every call, then runs an fp32 (CUDA-core) GEMM on it.
For the head (129,280 x 5,120: a 2.6 GB copy) that was ~2.5 ms per decode step at batch 32 on an H200 (session 15's
profile of the medium model's decode, docs/reports/runtime-decode.md). The kernel reads the 1.3 GB bf16 head once.

Accuracy: the tensor core's own accumulation is not IEEE fp32 addition, so each 64-wide K step's MMA starts from zero
and is added into the fp32 accumulator by an ordinary (round-to-nearest) add, as DeepGEMM promotes its FP8 MMAs.

Batch invariance: one tile shape for every T (128 weight rows x 32 tokens, K in steps of 64 in ascending order), so
a row's outputs have the same bits whatever else is in the batch, as the engine's recomputation after preemption
and its data-parallel ranks need (the GEMM kernels of mini-deepgemm keep the same property).

Split-K (`k_slice`, the MoE gate): with N = 384 the unsplit grid is 3 programs per 32 tokens, each streaming all of
K = 5,120 (~34 us per layer at 64 decode tokens on H200, latency-bound). With k_slice, K is cut into fixed slices of
k_slice columns (the last may be shorter); each slice is summed as above from zero, and the slice sums are added in
ascending slice order in fp32. The slice length is a constant of the call site, not of T, so a row's bits still do
not depend on the batch. Two ways to run it, bit for bit the same sums:
- split (few token tiles, decode): one program per (token tile, row tile, slice) writes its slice's sums to a plane
  of an fp32 workspace [slices, T, N]; the consumer (the MoE routing kernel, layers/moe_route.py) adds the planes
  in ascending order, starting from zero;
- whole rows (many token tiles, prefill): one program per (token tile, row tile) runs over all slices, adding each
  slice sum into its accumulator in the same order: no workspace, whose traffic (slices x T x N x 4 bytes, 63 MB
  for the gate at 4,096 tokens) buys little once the unsplit grid fills the GPU anyway.
The split path has its own tile shape (SPLIT_BLOCK_N rows), the same in both ways and for every T.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference formula runs instead
    triton = None

BLOCK_N, BLOCK_T, BLOCK_K = 128, 32, 64
# The split path's weight rows per program: 64 (the smallest wgmma M of one warpgroup) doubles the programs of a
# narrow weight like the gate's (384 rows: 6 row tiles instead of 3) at no cost in weight traffic.
SPLIT_BLOCK_N = 64
# A sliced call runs split below this many whole-row programs: two per SM of an H200 (132 SMs). A constant, as the
# choice changes no bits (split_grid); session 42's helper runs measured split faster up to 1,024 gate tokens and
# whole rows at 2,048 (docs/reports/data/s42-helper-run4/).
SPLIT_BELOW_PROGRAMS = 264


def linear_fp32_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The reference: fp32 [T, N] = x.float() @ w.float().T."""
    return x.float() @ w.float().T


if triton is not None:

    @triton.jit
    def _add_f32(a, b, INTERPRETED: tl.constexpr):
        """a + b, fp32, round to nearest, as inline PTX: Triton folds a plain `acc + tl.dot(w, x)` back into the MMA's
        own accumulation (its dot-add combine pattern), which is what the kernel avoids. The interpreter (numpy)
        runs no PTX; its `+` is the same IEEE add."""
        if INTERPRETED:
            return a + b
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                         pack=1)

    @triton.jit
    def _k_range_sum(w_rows, x_rows, offs_n, offs_t, N, T, D, k_lo, k_hi, BLOCK_N: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRETED: tl.constexpr):
        """fp32 [BLOCK_N, BLOCK_T]: sum over k in [k_lo, k_hi) of w[n, k] * x[t, k], K steps of BLOCK_K from k_lo in
        ascending order, each step's MMA from zero, added to the sum from zero (k_lo: a multiple of BLOCK_K)."""
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k in range(k_lo, k_hi, BLOCK_K):
            in_k = (k + offs_k) < D
            w = tl.load(w_rows + (k + offs_k)[None, :], mask=(offs_n < N)[:, None] & in_k[None, :], other=0.0)
            x = tl.load(x_rows + (k + offs_k)[None, :], mask=(offs_t < T)[:, None] & in_k[None, :], other=0.0)
            if INTERPRETED:  # the interpreter's dot misreads bf16; in fp32 the products are the same (exact)
                step = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), input_precision="ieee")
            else:
                # weight rows as the MMA's M (T may be 1); each K step's MMA starts from zero and is added to acc in
                # fp32 (round to nearest): chaining the MMAs through acc measured 5.6e-6 relative L2 against the
                # fp64 product at D = 5,120, 50x the fp32 GEMM's 1e-7 (session 15 run 3): the tensor core's
                # accumulation is not IEEE fp32 addition
                step = tl.dot(w, tl.trans(x))
            acc = _add_f32(acc, step, INTERPRETED)
        return acc

    @triton.jit
    def _linear_fp32_kernel(x_ptr, w_ptr, out_ptr, T, N, D, stride_x, stride_w, stride_out, k_slice, stride_plane,
                            BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                            SLICED: tl.constexpr, SPLIT: tl.constexpr, INTERPRETED: tl.constexpr):
        """Grid (token tiles, weight-row tiles[, slices]): out[t, n] = sum_k x[t, k] * w[n, k] in fp32. Token tiles
        are the fast axis, so the programs that share a weight tile run together and it is read from DRAM once.
        SLICED=False: one sum over all of K (the head). SLICED and SPLIT: program (.., .., s) writes the sum of
        slice s (K columns [s * k_slice, (s + 1) * k_slice)) to plane s (out_ptr + s * stride_plane). SLICED, not
        SPLIT: the slice sums added in ascending order into one accumulator from zero (what adding the planes
        gives)."""
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
        x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_x
        if not SLICED:
            acc = _k_range_sum(w_rows, x_rows, offs_n, offs_t, N, T, D, 0, D, BLOCK_N, BLOCK_T, BLOCK_K, INTERPRETED)
        elif SPLIT:
            k_lo = tl.program_id(2) * k_slice
            acc = _k_range_sum(w_rows, x_rows, offs_n, offs_t, N, T, D, k_lo, tl.minimum(k_lo + k_slice, D),
                               BLOCK_N, BLOCK_T, BLOCK_K, INTERPRETED)
            out_ptr += tl.program_id(2).to(tl.int64) * stride_plane
        else:
            acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
            for k_lo in range(0, D, k_slice):
                part = _k_range_sum(w_rows, x_rows, offs_n, offs_t, N, T, D, k_lo, tl.minimum(k_lo + k_slice, D),
                                    BLOCK_N, BLOCK_T, BLOCK_K, INTERPRETED)
                acc = _add_f32(acc, part, INTERPRETED)
        out = out_ptr + offs_t.to(tl.int64)[None, :] * stride_out + offs_n[:, None]
        tl.store(out, acc, mask=(offs_t < T)[None, :] & (offs_n < N)[:, None])


def split_grid(T: int, N: int, device: torch.device) -> bool:
    """Whether a sliced call of T rows on an N-row weight runs split (one program per slice, through planes): while
    the unsplit grid (token tiles x row tiles) has fewer than SPLIT_BELOW_PROGRAMS programs, i.e. the SMs would each
    stream long runs of K for a few programs. Either way gives the same bits, so the choice may follow T. Off CUDA
    (the interpreter) it splits."""
    if device.type != "cuda":
        return True
    return triton.cdiv(T, BLOCK_T) * triton.cdiv(N, SPLIT_BLOCK_N) < SPLIT_BELOW_PROGRAMS


def _check(x: torch.Tensor, w: torch.Tensor, k_slice: int | None) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"linear_fp32: x {tuple(x.shape)} and w {tuple(w.shape)} do not share D")
    if k_slice is not None and (k_slice <= 0 or k_slice % BLOCK_K):
        raise ValueError(f"linear_fp32: k_slice {k_slice} is not a positive multiple of {BLOCK_K}")


def linear_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [T, N] = x @ w^T of bf16 x [T, D] and bf16 w [N, D] (unit column strides): the Triton kernel on CUDA, the
    reference elsewhere or for other dtypes. Equal to linear_fp32_ref up to the fp32 summation order. One sum over
    all of K (the head: its vocabulary already gives thousands of programs); the gate's split-K form is
    linear_fp32_planes."""
    _check(x, w, None)
    usable = (triton is not None and x.is_cuda and w.is_cuda and x.dtype == torch.bfloat16
              and w.dtype == torch.bfloat16 and x.stride(1) == 1 and w.stride(1) == 1)
    if not usable:
        return linear_fp32_ref(x, w)
    (T, D), N = x.shape, w.shape[0]
    out = torch.empty(T, N, dtype=torch.float32, device=x.device)
    if T:
        grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(N, BLOCK_N))
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        _linear_fp32_kernel[grid](x, w, out, T, N, D, x.stride(0), w.stride(0), out.stride(0), D, 0,
                                  BLOCK_N=BLOCK_N, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, SLICED=False, SPLIT=False,
                                  INTERPRETED=False, num_warps=4, num_stages=4, enable_fp_fusion=True)
    return out


def linear_fp32_planes(x: torch.Tensor, w: torch.Tensor, k_slice: int, split: bool | None = None) -> torch.Tensor:
    """The split-K product (slices of k_slice columns, a multiple of BLOCK_K fixed per call site) as fp32 planes
    [P, T, N] whose fp32 sum in ascending plane order, starting from zero, is the same bits whichever way and at
    every T: P = the number of slices (split) or 1 (whole rows). split None: split_grid's choice. On any device
    Triton runs on (CUDA, or CPU tensors under TRITON_INTERPRET=1); bf16 x and w with unit column strides."""
    _check(x, w, k_slice)
    (T, D), N = x.shape, w.shape[0]
    if split is None:
        split = split_grid(T, N, x.device)
    n_slices = max(triton.cdiv(D, k_slice), 1)
    planes = torch.empty(n_slices if split else 1, T, N, dtype=torch.float32, device=x.device)
    if T and N:
        grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(N, SPLIT_BLOCK_N)) + ((n_slices,) if split else ())
        _linear_fp32_kernel[grid](x, w, planes, T, N, D, x.stride(0), w.stride(0), N, k_slice, T * N,
                                  BLOCK_N=SPLIT_BLOCK_N, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, SLICED=True, SPLIT=split,
                                  INTERPRETED=not x.is_cuda, num_warps=4, num_stages=4, enable_fp_fusion=True)
    return planes

