"""TileLang sparse MLA forward (64 heads) over bf16 rows and over the paged FP8/FP4 cache: an experiment (issue 5).

Measured against the Triton kernels by exp_flashmla_tilelang.py, with the result in
docs/reports/flashmla-tilelang-experiment.md: correct (the same checks as the Triton kernel), as fast for bf16 rows,
2.3x slower for the quantized rows. So it is not in the mini_flashmla package; it stays here as the measured code.

Why it was tried: the Triton kernel is latency- and issue-bound (docs/reports/flashmla-sparse-attention.md: 255
registers with spills, no control over which warpgroup computes what). TileLang states the schedule:
- Q [64, 512] staged once in shared memory; each 64-slot block of rows gathered into shared memory by cp.async
  (16 B per copy) `num_stages` blocks ahead; quantized rows gathered as raw bytes, then dequantized shared -> shared;
- S = Q K^T split by columns over the two warpgroups (a 64 x 32 wgmma tile each), the softmax's row max and sum
  reduced across them through shared memory, P written once to shared memory as bf16;
- O = P V split by columns (each warpgroup owns 256 of the 512 output dims: 128 fp32 registers per thread).

The math is the reference's (reference.sparse_attn_ref): blocks of 64 index slots, running max from -1e30, P
rounded to bf16 before P.V, the sink in the denominator only, lse without the sink, in the log2 domain like the
Triton kernel; each source its own blocks, like the Triton kernel. Rows whose id is -1 or outside the cache score
-inf; their copy reads a clamped row id (finite data) that P = 0 then discards, so no load is out of range.
Coverage: h = 64, d = 512, at least one row per cache.
"""

import functools  # no `from __future__ import annotations`: TileLang evaluates the kernel's annotations

import tilelang
import tilelang.language as T
import torch
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, WINDOW_ROW_BYTES

HEADS, HEAD_DIM, BLOCK = 64, 512, 64
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@T.macro
def _dequant_fp8_window(Wv_s, Ws_s, KV_s):
    """KV_s[i, j] = e4m3 value x 2^(e - 127) (exact in bf16), from a window row's 512 bytes and 16 exponents."""
    for i, j in T.Parallel(BLOCK, HEAD_DIM):
        KV_s[i, j] = T.Cast("bfloat16", T.Cast("float32", T.reinterpret(Wv_s[i, j], "float8_e4m3fn"))
                            * T.reinterpret(T.shift_left(T.Cast("int32", Ws_s[i, j // 32]), 23), "float32"))


@T.macro
def _dequant_fp4_compressed(Cv_s, Cs_s, KV_s):
    """KV_s[i, j] = e2m1 code x e4m3 scale (exact in bf16): code = nibble j % 2 of byte j // 2 (low = even dim), the
    scale of dims 16g..16g+15 at byte 256 + g. The code's fp32 bits are built in integer ops: codes 2..7 are
    (1 + (c & 1) / 2) x 2^((c >> 1) - 1), code 1 is 0.5, the sign is bit 3."""
    for i, j in T.Parallel(BLOCK, HEAD_DIM):
        code = T.bitwise_and(T.shift_right(T.Cast("int32", Cv_s[i, j // 2]), (j % 2) * 4), 15)
        mag = T.bitwise_and(code, 7)
        bits = T.if_then_else(
            mag >= 2, T.bitwise_or(T.shift_left(T.shift_right(mag, 1) + 126, 23), T.shift_left(T.bitwise_and(mag, 1), 22)),
            T.if_then_else(mag == 1, 0x3F000000, 0))
        value = T.reinterpret(bits, "float32") * T.Cast("float32", T.reinterpret(Cs_s[i, j // 16], "float8_e4m3fn"))
        KV_s[i, j] = T.Cast("bfloat16", T.if_then_else(code >= 8, -value, value))


@functools.cache
def _kernel(formats: tuple[str, ...], lens: tuple[int, ...], scale_log2: float, has_sink: bool, num_stages: int):
    """One compile per (row formats, index lengths, scale, sink, stages); s_q and the row counts are dynamic.

    formats: ("bf16",) for sparse_mla_fwd, ("fp8", "fp4") or ("fp8",) for the paged cache; lens: index slots per
    query of each source. Each source is one pipelined loop over its 64-slot blocks (as the Triton kernel: a
    source's last block may be partial and the next source starts a new block)."""
    S, R0, R1 = T.dynamic("S, R0, R1")
    H, D, BI = HEADS, HEAD_DIM, BLOCK
    bf16, f32 = "bfloat16", "float32"
    row_bytes = {"bf16": D, "fp8": WINDOW_ROW_BYTES, "fp4": COMPRESSED_KV_ROW_BYTES}
    shapes = [((R0, row_bytes[formats[0]]), "bfloat16" if formats[0] == "bf16" else "uint8")]
    shapes.append(((R1, row_bytes[formats[1]]), "uint8") if len(formats) == 2 else ((1, 1), "uint8"))
    lens2 = (lens[0], lens[1] if len(lens) == 2 else 1)

    @T.macro
    def attend(Q_s, KV_s, P_s, S_f, O_f, m, m_prev, l, l_blk, alpha, Idx, sq, n, rows, t):
        """One 64-slot block whose rows are in KV_s: scores, online softmax, O += P V."""
        for h, i in T.Parallel(H, BI):
            S_f[h, i] = T.if_then_else(
                (t * BI + i < n) and (Idx[sq, T.min(t * BI + i, n - 1)] >= 0)
                and (Idx[sq, T.min(t * BI + i, n - 1)] < rows), 0, -T.infinity(f32))
        T.gemm(Q_s, KV_s, S_f, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
        for h, i in T.Parallel(H, BI):
            S_f[h, i] = S_f[h, i] * scale_log2
        T.copy(m, m_prev)
        T.reduce_max(S_f, m, dim=1, clear=False)
        for h in T.Parallel(H):
            alpha[h] = T.exp2(m_prev[h] - m[h])
        for h, i in T.Parallel(H, BI):
            S_f[h, i] = T.exp2(S_f[h, i] - m[h])
        T.reduce_sum(S_f, l_blk, dim=1)
        for h in T.Parallel(H):
            l[h] = l[h] * alpha[h] + l_blk[h]
        T.copy(S_f, P_s)
        for h, j in T.Parallel(H, D):
            O_f[h, j] = O_f[h, j] * alpha[h]
        T.gemm(P_s, KV_s, O_f, policy=T.GemmWarpPolicy.FullCol)

    @T.prim_func
    def attn(Q: T.Tensor((S, H, D), bf16), KV0: T.Tensor(*shapes[0]), Idx0: T.Tensor((S, lens2[0]), "int32"),
             KV1: T.Tensor(*shapes[1]), Idx1: T.Tensor((S, lens2[1]), "int32"),
             Sink: T.Tensor((H,), f32), Out: T.Tensor((S, H, D), bf16), Lse: T.Tensor((S, H), f32)):
        with T.Kernel(S, threads=256) as sq:
            Q_s = T.alloc_shared((H, D), bf16)
            KV_s = T.alloc_shared((BI, D), bf16)
            P_s = T.alloc_shared((H, BI), bf16)
            S_f = T.alloc_fragment((H, BI), f32)
            O_f = T.alloc_fragment((H, D), f32)
            m = T.alloc_fragment((H,), f32)
            m_prev = T.alloc_fragment((H,), f32)
            l = T.alloc_fragment((H,), f32)
            l_blk = T.alloc_fragment((H,), f32)
            alpha = T.alloc_fragment((H,), f32)
            T.copy(Q[sq, 0, 0], Q_s)
            T.fill(O_f, 0)
            T.fill(l, 0)
            T.fill(m, -1e30)

            if formats[0] == "bf16":
                for t in T.Pipelined(T.ceildiv(lens[0], BI), num_stages=num_stages):
                    for i, j in T.Parallel(BI, D):  # a clamped id for empty slots: finite data that P = 0 drops
                        KV_s[i, j] = KV0[T.max(T.min(Idx0[sq, T.min(t * BI + i, lens[0] - 1)], R0 - 1), 0), j]
                    attend(Q_s, KV_s, P_s, S_f, O_f, m, m_prev, l, l_blk, alpha, Idx0, sq, lens[0], R0, t)
            else:
                Wv_s = T.alloc_shared((BI, D), "uint8")
                Ws_s = T.alloc_shared((BI, D // 32), "uint8")
                for t in T.Pipelined(T.ceildiv(lens[0], BI), num_stages=num_stages):
                    for i, j in T.Parallel(BI, D):
                        Wv_s[i, j] = KV0[T.max(T.min(Idx0[sq, T.min(t * BI + i, lens[0] - 1)], R0 - 1), 0), j]
                    for i, j in T.Parallel(BI, D // 32):
                        Ws_s[i, j] = KV0[T.max(T.min(Idx0[sq, T.min(t * BI + i, lens[0] - 1)], R0 - 1), 0), D + j]
                    _dequant_fp8_window(Wv_s, Ws_s, KV_s)
                    attend(Q_s, KV_s, P_s, S_f, O_f, m, m_prev, l, l_blk, alpha, Idx0, sq, lens[0], R0, t)
            if len(formats) == 2:
                Cv_s = T.alloc_shared((BI, D // 2), "uint8")
                Cs_s = T.alloc_shared((BI, D // 16), "uint8")
                for t in T.Pipelined(T.ceildiv(lens[1], BI), num_stages=num_stages):
                    for i, j in T.Parallel(BI, D // 2):
                        Cv_s[i, j] = KV1[T.max(T.min(Idx1[sq, T.min(t * BI + i, lens[1] - 1)], R1 - 1), 0), j]
                    for i, j in T.Parallel(BI, D // 16):
                        Cs_s[i, j] = KV1[T.max(T.min(Idx1[sq, T.min(t * BI + i, lens[1] - 1)], R1 - 1), 0),
                                         D // 2 + j]
                    _dequant_fp4_compressed(Cv_s, Cs_s, KV_s)
                    attend(Q_s, KV_s, P_s, S_f, O_f, m, m_prev, l, l_blk, alpha, Idx1, sq, lens[1], R1, t)
            for h in T.Parallel(H):
                Lse[sq, h] = T.if_then_else(l[h] > 0, (m[h] + T.log2(l[h])) * LN2, -T.infinity(f32))
                if has_sink:
                    l[h] = l[h] + T.exp2(Sink[h] * LOG2E - m[h])
            for h, j in T.Parallel(H, D):
                O_f[h, j] = T.if_then_else(l[h] > 0, O_f[h, j] / l[h], 0)
            T.copy(O_f, Out[sq, 0, 0])

    return tilelang.compile(attn, out_idx=None, target={"kind": "cuda", "arch": "sm_90a"})


def supports(q: torch.Tensor, *caches: torch.Tensor | None) -> bool:
    """True when this kernel covers the call: 64 heads, contiguous q, at least one row in every given cache."""
    return (q.shape[1] == HEADS and q.shape[2] == HEAD_DIM and q.is_contiguous()
            and all(c.shape[0] > 0 for c in caches if c is not None))


def _launch(q, sources, sm_scale, attn_sink, num_stages):
    """sources: [(rows, ids, format)], one or two. Allocates and returns (out, lse)."""
    s_q, h, d = q.shape
    out = torch.empty((s_q, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((s_q, h), dtype=torch.float32, device=q.device)
    if s_q == 0:
        return out, lse
    args = []
    for rows, ids, _ in sources:
        args += [rows.contiguous(), ids.to(torch.int32).contiguous()]
    if len(sources) == 1:  # the second source's placeholders (never read)
        args += [torch.zeros((1, 1), dtype=torch.uint8, device=q.device),
                 torch.zeros((s_q, 1), dtype=torch.int32, device=q.device)]
    sink = attn_sink.float().contiguous() if attn_sink is not None else lse.new_zeros(h)
    kernel = _kernel(tuple(f for _, _, f in sources), tuple(ids.shape[1] for _, ids, _ in sources),
                     float(sm_scale) * LOG2E, attn_sink is not None, num_stages)
    kernel(q, *args, sink, out, lse)
    return out, lse


def sparse_mla_fwd_bf16(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                        attn_sink: torch.Tensor | None = None, num_stages: int = 2
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as api.sparse_mla_fwd (q bf16 [s_q, 64, 512], kv bf16 [n_kv, 512], indices int32
    [s_q, topk], -1 = empty; returns out bf16 [s_q, 64, 512] and lse fp32 [s_q, 64]); requires `supports`."""
    return _launch(q, [(kv, indices, "bf16")], sm_scale, attn_sink, num_stages)


def sparse_mla_fwd_paged(q: torch.Tensor, window_cache: torch.Tensor, compressed_cache: torch.Tensor | None,
                         window_ids: torch.Tensor, compressed_ids: torch.Tensor | None, sm_scale: float,
                         attn_sink: torch.Tensor | None = None, num_stages: int = 2
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as api.sparse_mla_fwd_paged without splits (window uint8 [*, 528] rows, compressed uint8
    [*, 288] rows or None, flat int32 ids, -1 = empty); requires `supports`."""
    sources = [(window_cache, window_ids, "fp8")]
    if compressed_cache is not None:
        sources.append((compressed_cache, compressed_ids, "fp4"))
    return _launch(q, sources, sm_scale, attn_sink, num_stages)


__all__ = ["sparse_mla_fwd_bf16", "sparse_mla_fwd_paged", "supports"]
