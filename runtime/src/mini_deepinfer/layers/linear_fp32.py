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
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference formula runs instead
    triton = None

BLOCK_N, BLOCK_T, BLOCK_K = 128, 32, 64


def linear_fp32_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The reference: fp32 [T, N] = x.float() @ w.float().T."""
    return x.float() @ w.float().T


if triton is not None:

    @triton.jit
    def _add_f32(a, b):
        """a + b, fp32, round to nearest, as inline PTX: Triton folds a plain `acc + tl.dot(w, x)` back into the MMA's
        own accumulation (its dot-add combine pattern), which is what the kernel avoids."""
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                         pack=1)

    @triton.jit
    def _linear_fp32_kernel(x_ptr, w_ptr, out_ptr, T, N, D, stride_x, stride_w, stride_out,
                            BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
        """Grid (token tiles, weight-row tiles): out[t, n] = sum_k x[t, k] * w[n, k] in fp32. Token tiles are the
        fast axis, so the programs that share a weight tile run together and it is read from DRAM once."""
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
        x_rows = x_ptr + offs_t.to(tl.int64)[:, None] * stride_x
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k in range(0, D, BLOCK_K):
            in_k = (k + offs_k) < D
            w = tl.load(w_rows + (k + offs_k)[None, :], mask=(offs_n < N)[:, None] & in_k[None, :], other=0.0)
            x = tl.load(x_rows + (k + offs_k)[None, :], mask=(offs_t < T)[:, None] & in_k[None, :], other=0.0)
            # weight rows as the MMA's M (T may be 1); each K step's MMA starts from zero and is added to acc in
            # fp32 (round to nearest): chaining the MMAs through acc measured 5.6e-6 relative L2 against the fp64
            # product at D = 5,120, 50x the fp32 GEMM's 1e-7 (session 15 run 3): the tensor core's accumulation is
            # not IEEE fp32 addition
            acc = _add_f32(acc, tl.dot(w, tl.trans(x)))
        out = out_ptr + offs_t.to(tl.int64)[None, :] * stride_out + offs_n[:, None]
        tl.store(out, acc, mask=(offs_t < T)[None, :] & (offs_n < N)[:, None])


def linear_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [T, N] = x @ w^T of bf16 x [T, D] and bf16 w [N, D] (unit column strides): the Triton kernel on CUDA, the
    reference elsewhere or for other dtypes. Equal to linear_fp32_ref up to the fp32 summation order."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"linear_fp32: x {tuple(x.shape)} and w {tuple(w.shape)} do not share D")
    usable = (triton is not None and x.is_cuda and w.is_cuda and x.dtype == torch.bfloat16
              and w.dtype == torch.bfloat16 and x.stride(1) == 1 and w.stride(1) == 1)
    if not usable:
        return linear_fp32_ref(x, w)
    (T, D), N = x.shape, w.shape[0]
    out = torch.empty(T, N, dtype=torch.float32, device=x.device)
    if T:
        grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(N, BLOCK_N))
        _linear_fp32_kernel[grid](x, w, out, T, N, D, x.stride(0), w.stride(0), out.stride(0),
                                  BLOCK_N=BLOCK_N, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K, num_warps=4, num_stages=4)
    return out
