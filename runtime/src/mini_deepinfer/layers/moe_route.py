"""MoE routing of the engine model in two Triton launches: the gate's split-K GEMM, then one kernel for the rest.

Why: ops.moe_route cost ~55 us of GPU time per layer at 64 decode tokens on H200 (2.2 ms of a 40-layer step): ~34 us
in the gate GEMM (layers/linear_fp32.py unsplit: 6 programs for 64 tokens, each streaming all of K = 5,120, so
latency-bound) and ~21 us in ~10 small torch kernels of the tail (divide, softplus, sqrt, bias cast and add, topk,
gather, sum, divide, multiply).

How:
- the gate: `linear_fp32_planes` with GATE_K_SLICE (split-K with a slice length fixed here, so a token's scores do
  not depend on the batch); at decode it writes one fp32 plane per K slice;
- `moe_route_kernel`, one program per token: adds the planes in ascending order from zero (the sum whose bits do
  not depend on the batch, linear_fp32.py), then s = sqrt(softplus(scores / gate_temp)), the top k of s + bias, the
  weights gathered from s, normalised and scaled, all in registers; writes ids int64 [T, k] and weights fp32 [T, k].

Numerics against the torch chain (ops.moe_route_from_scores) on the same fp32 scores:
- on CUDA bit-identical up to the weights' sum: the divide by gate_temp (an IEEE division; torch on CUDA multiplies by
  the fp32 reciprocal of a Python-scalar divisor instead: the same at gate_temp 1.0, the V4.1 value), softplus as
  torch defines it for beta 1, threshold 20 (z if z > 20, else log1p(exp(z)) with libdevice's expf and log1pf, the
  CUDA math library's functions that torch's kernel calls), sqrt rounded to nearest (sqrt_rn, div_rn: Triton's
  `/` on fp32 is div.full, ~2 ulp, and tl.sqrt approximate), the bias cast to fp32 and added: so s and the biased
  scores, hence the selected ids. Subnormals included: Triton links libdevice in flush-to-zero mode unless told
  otherwise (enable_reflect_ftz=False here), and then exp(z) for z < -87.3 would be 0 where torch's is subnormal;
- ids: sorted by biased score descending, as torch.topk returns them; equal scores are taken lowest expert id first
  (torch.topk leaves the order of ties unspecified: tests compare ids tie-aware);
- weights: the k values of s summed in slot order (((w0 + w1) + w2) + ...), + 1e-20, an IEEE division, times
  routed_scaling_factor, all fp32. torch's reduction order of the sum is its own, so a weight may differ from the
  chain's in the last bits (tests: rtol 1e-6); with the sum taken in slot order the chain gives the kernel's bits
  (runtime/tests/test_moe_route.py checks both on CUDA).
- NaN scores: picked first, as +inf (torch.topk ranks NaN above +inf); their weights are NaN, as torch's.
Under TRITON_INTERPRET=1 (CPU tests) exp and log1p come from numpy (the interpreter cannot call libdevice), log1p
through log (within a few ulps), so only the tolerances hold there.
"""

from __future__ import annotations

import torch

from mini_deepinfer.layers.linear_fp32 import linear_fp32_planes

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice
except ImportError:  # CPU-only installs: the torch chain in ops.py runs instead
    triton = None

# The gate's K slice (K = 5,120: 10 slices). With linear_fp32's split tile (64 weight rows x 32 tokens) the 384-row
# gate has 6 x 10 = 60 programs per 32 tokens: 120 at 64 decode tokens, about one per SM of an H200 (132), each 8
# steps of K instead of the unsplit kernel's 80. The planes cost slices x T x 384 x 4 bytes: 0.98 MB at 64 tokens,
# a quarter of the 3.9 MB bf16 weight, written once and read once, and L2-resident at that size. 1,024 halves the
# planes but leaves 60 programs for 64 tokens (half the SMs idle, chains of 16 steps); 256 gives 240 programs but
# doubles the planes to half the weight's bytes and leaves 4-step chains, mostly pipeline prologue. Past ~1,400
# tokens linear_fp32 runs whole rows (no planes; linear_fp32.split_grid), with the same bits.
GATE_K_SLICE = 512  # a multiple of linear_fp32.BLOCK_K
MAX_EXPERTS = 1024  # one program holds a token's whole score row in registers (E padded to a power of two)
# Warps of a route program: few tokens (decode) leave most SMs idle, so 4 warps shorten each program's chain of 3k
# reductions over the padded row (4 lanes a thread at E = 384); many tokens fill the GPU, and one-warp programs avoid
# the cross-warp steps through shared memory. The count changes no result (the reductions are max / min, exact in any
# order; the k-sum is sequential), so it may follow T.
ROUTE_WARPS = 4  # calls of fewer than MANY_T tokens
ROUTE_WARPS_MANY_T = 1
MANY_T = 1024

if triton is not None:

    @triton.jit
    def _log1p_from_log(u):
        """log1p(u), u >= 0, from log alone (the interpreter cannot call libdevice): log(1 + u) * u / ((1 + u) - 1)
        cancels the rounding of 1 + u, within a few ulps; u itself where 1 + u rounds to 1."""
        v = 1.0 + u
        return tl.where(v == 1.0, u, tl.log(v) * tl.div_rn(u, v - 1.0))

    @triton.jit
    def moe_route_kernel(planes_ptr, bias_ptr, idx_ptr, wt_ptr, T, E, n_planes, gate_temp, route_scale,
                         K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, LIBDEVICE: tl.constexpr):
        """Program t: token t's gate scores = the planes [n_planes, T, E] added in ascending order from zero, then
        ids[t] = the K experts of largest s + bias (descending, ties to the lower id), wt[t] = their s normalised
        to sum to route_scale."""
        t = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, E_PAD)
        real = e < E
        plane = planes_ptr + t * E + e
        logit = tl.zeros([E_PAD], dtype=tl.float32)
        for _ in range(n_planes):  # (0 + p0) + p1 + ..., the order linear_fp32_planes defines
            logit += tl.load(plane, mask=real, other=0.0)
            plane += T * E
        z = tl.div_rn(logit, tl.zeros([E_PAD], dtype=tl.float32) + gate_temp)  # div_rn does not broadcast
        if LIBDEVICE:  # torch's softplus: log1p(exp(z)) by the CUDA math library (tl.exp is ex2.approx based)
            soft = libdevice.log1p(libdevice.exp(z))
        else:
            soft = _log1p_from_log(tl.exp(z))
        s = tl.sqrt_rn(tl.where(z > 20.0, z, soft))  # tl.sqrt is the approximate one
        b = s + tl.load(bias_ptr + e, mask=real, other=0.0).to(tl.float32)
        key = tl.where(real, e, E_PAD + e)  # padding lanes are never free (k <= E leaves a free expert each pick)
        # NaN ranks as +inf (torch.topk: above it), so that every pick finds b == max(b) and an id in range
        nan = b != b  # noqa: PLR0124 (the NaN test; the interpreter has no libdevice.isnan)
        b = tl.where(real, tl.where(nan, float("inf"), b), float("-inf"))
        slot = tl.arange(0, K_PAD)
        ids = tl.zeros([K_PAD], dtype=tl.int32)
        wts = tl.zeros([K_PAD], dtype=tl.float32)
        total = tl.full([], 0.0, tl.float32)
        for i in tl.static_range(K):
            # the pick: the largest b, of equal ones the lowest key (a free expert's id; taken and padding lanes
            # carry keys past every free one, so they lose every tie, -inf ones too), and its unbiased s. Three
            # built-in reductions (max, min, max: exact, so their tree order does not matter), not one tl.reduce
            # with a custom combine, which the interpreter runs element by element in Python
            j = tl.min(tl.where(b == tl.max(b, axis=0), key, 2 * E_PAD), axis=0)
            taken = key == j
            s_j = tl.max(tl.where(taken, s, float("-inf")), axis=0)
            b = tl.where(taken, float("-inf"), b)
            key = tl.where(taken, key + E_PAD, key)  # j + E_PAD < E_PAD + E: no padding lane's key
            ids = tl.where(slot == i, j, ids)
            wts = tl.where(slot == i, s_j, wts)
            total += s_j  # slot order
        wts = tl.div_rn(wts, tl.zeros([K_PAD], dtype=tl.float32) + (total + 1e-20)) * route_scale
        tl.store(idx_ptr + t * K + slot, ids.to(tl.int64), mask=slot < K)
        tl.store(wt_ptr + t * K + slot, wts, mask=slot < K)


def available(x: torch.Tensor, gate_w: torch.Tensor, k: int) -> bool:
    """Whether the kernels apply: Triton importable, bf16 x [T, D] and gate weight [E, D] on CUDA with unit column
    strides, E <= MAX_EXPERTS, 1 <= k <= E; anything else takes the torch chain."""
    return (triton is not None and x.is_cuda and gate_w.is_cuda and x.dtype == torch.bfloat16
            and gate_w.dtype == torch.bfloat16 and x.dim() == 2 and gate_w.dim() == 2 and x.shape[1] == gate_w.shape[1]
            and x.stride(1) == 1 and gate_w.stride(1) == 1 and 1 <= k <= gate_w.shape[0] <= MAX_EXPERTS)


def moe_route_fused(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, k: int, gate_temp: float,
                    route_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.moe_route on the kernels: x bf16 [T, D], gate_w bf16 [E, D], bias [E] (fp32 or bf16). Returns (expert
    ids int64 [T, k], weights fp32 [T, k]). Two launches: the gate's planes (split-K, GATE_K_SLICE), the route."""
    return route_from_planes(linear_fp32_planes(x, gate_w, GATE_K_SLICE), bias, k, gate_temp, route_scale)


def route_from_planes(planes: torch.Tensor, bias: torch.Tensor, k: int, gate_temp: float, route_scale: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing tail by moe_route_kernel, on any device Triton runs on (CUDA, or CPU tensors under
    TRITON_INTERPRET=1). planes fp32 [P, T, E] (gate scores = their sum in ascending order; P = 1: the scores
    themselves) or [T, E]; bias [E]. Returns (ids int64 [T, k], weights fp32 [T, k])."""
    if planes.dim() == 2:
        planes = planes[None]
    P, T, E = planes.shape
    if planes.dtype != torch.float32 or not 1 <= k <= E or E > MAX_EXPERTS or bias.shape != (E,):
        raise ValueError(f"route_from_planes: planes {planes.dtype} {tuple(planes.shape)}, bias "
                         f"{tuple(bias.shape)}, k {k} (E <= {MAX_EXPERTS}, 1 <= k <= E)")
    planes, bias = planes.contiguous(), bias.contiguous()
    idx = torch.empty(T, k, dtype=torch.int64, device=planes.device)
    wt = torch.empty(T, k, dtype=torch.float32, device=planes.device)
    if T:
        # enable_reflect_ftz=False: Triton links libdevice in flush-to-zero mode by default, so expf would return 0
        # where torch's returns a subnormal (z < -87.3); the interpreter takes no such option
        cuda_only = {"enable_reflect_ftz": False} if planes.is_cuda else {}
        warps = ROUTE_WARPS if T < MANY_T else ROUTE_WARPS_MANY_T
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        moe_route_kernel[(T,)](planes, bias, idx, wt, T, E, P, float(gate_temp), float(route_scale), K=k,
                               K_PAD=triton.next_power_of_2(k), E_PAD=triton.next_power_of_2(E),
                               LIBDEVICE=planes.is_cuda, num_warps=warps, **cuda_only, enable_fp_fusion=True)
    return idx, wt

