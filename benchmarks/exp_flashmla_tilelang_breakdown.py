"""Experiment (issue 5): where a 64-slot block's time goes in the TileLang sparse attention schedule.

Builds variants of sparse_attn_tilelang's kernel with parts removed and times each on the prefill shape
(s_q 4096, h 64, topk 640, 131k bf16 rows): the full kernel; the rows gathered once before the loop instead of
per block (no per-block copy: compute only); that without the softmax (the two MMAs, P = S cast to bf16); only the
QK^T MMA; only the P.V MMA. The variants compute garbage except `full`; only their times matter.
Writes $OUT/exp_flashmla_tilelang_breakdown.json.
"""

from __future__ import annotations

import json
import os
import time

import tilelang
import tilelang.language as T
import torch
import triton.testing

H, D, BI = 64, 512, 64


def build(topk: int, gather: bool, softmax: bool, qk: bool, pv: bool, stages: int = 2):
    S, NKV = T.dynamic("S, NKV")
    bf16, f32 = "bfloat16", "float32"

    @T.prim_func
    def attn(Q: T.Tensor((S, H, D), bf16), KV: T.Tensor((NKV, D), bf16), Idx: T.Tensor((S, topk), "int32"),
             Out: T.Tensor((S, H, D), bf16)):
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
            T.fill(m_prev, 0)
            T.fill(alpha, 0)
            T.fill(l_blk, 0)
            T.fill(S_f, 0)
            if not gather:
                for i, j in T.Parallel(BI, D):
                    KV_s[i, j] = KV[T.max(T.min(Idx[sq, i], NKV - 1), 0), j]
            for t in T.Pipelined(T.ceildiv(topk, BI), num_stages=stages):
                if gather:
                    for i, j in T.Parallel(BI, D):
                        KV_s[i, j] = KV[T.max(T.min(Idx[sq, T.min(t * BI + i, topk - 1)], NKV - 1), 0), j]
                if softmax:
                    for h, i in T.Parallel(H, BI):
                        S_f[h, i] = T.if_then_else(Idx[sq, T.min(t * BI + i, topk - 1)] >= 0, 0, -T.infinity(f32))
                if qk:
                    T.gemm(Q_s, KV_s, S_f, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                if softmax:
                    for h, i in T.Parallel(H, BI):
                        S_f[h, i] = S_f[h, i] * 0.0625
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
                if softmax:
                    for h, j in T.Parallel(H, D):
                        O_f[h, j] = O_f[h, j] * alpha[h]
                if pv:
                    T.gemm(P_s, KV_s, O_f, policy=T.GemmWarpPolicy.FullCol)
            if not softmax:  # the unused row statistics still need a layout
                for h in T.Parallel(H):
                    l[h] = l[h] + m[h] + m_prev[h] + alpha[h] + l_blk[h]
            for h, j in T.Parallel(H, D):
                O_f[h, j] = O_f[h, j] / (l[h] + 1.0)
            T.copy(O_f, Out[sq, 0, 0])

    return tilelang.compile(attn, out_idx=None, target={"kind": "cuda", "arch": "sm_90a"})


VARIANTS = {
    "full": dict(gather=True, softmax=True, qk=True, pv=True),
    "no_gather": dict(gather=False, softmax=True, qk=True, pv=True),
    "no_gather_no_softmax": dict(gather=False, softmax=False, qk=True, pv=True),
    "gather_only": dict(gather=True, softmax=False, qk=False, pv=False),
    "qk_only": dict(gather=False, softmax=False, qk=True, pv=False),
    "pv_only": dict(gather=False, softmax=False, qk=False, pv=True),
    "gather_qk_pv_no_softmax": dict(gather=True, softmax=False, qk=True, pv=True),
}


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    s_q, topk, context = 4096, 640, 131072
    q = torch.randn(s_q, H, D, device=dev, generator=g).bfloat16()
    kv = torch.randn(context, D, device=dev, generator=g).bfloat16()
    idx = torch.randint(0, context, (s_q, topk), device=dev, generator=g).sort(1).values.to(torch.int32)
    out = torch.empty(s_q, H, D, device=dev, dtype=torch.bfloat16)
    flops = 2 * s_q * H * topk * 2 * D
    res = {"utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "gpu": torch.cuda.get_device_name(dev),
           "shape": "s_q 4096, h 64, topk 640, 131072 bf16 rows"}
    for name, flags in VARIANTS.items():
        try:
            k = build(topk, **flags)
            t = triton.testing.do_bench(lambda: k(q, kv, idx, out), warmup=25, rep=100, return_mode="median")
            res[name] = {"ms": t, "us_per_block_per_sm": t * 1e3 * 132 / (s_q * topk / BI),
                         "tflops_equiv": flops / t / 1e9}
        except Exception as exc:
            res[name] = {"error": repr(exc)[:300]}
        print(name, res[name], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_flashmla_tilelang_breakdown.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
