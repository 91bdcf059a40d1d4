"""Experiment (session 3): the swap-AB bf16-dequant kernels of gemm_swapab_kernel.py against the current
UE8M0 kernel and the cuBLAS peers, at the V4.1 prefill shapes. Prints one JSON line per measurement and a table.

Usage (GPU machine): python3 benchmarks/exp_gemm_swapab.py [--out DIR] [--real-moe | --fp4-ptx | --fp4-tiles | --decode | --scale-words | --dequant-sweep]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from bench_deepgemm import Recorder, contiguous_operands, dense_operands, ms, rand_fp8, rand_ue8m0
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_kernel import LAYOUT_CONTIGUOUS
from mini_deepgemm.testing import calc_diff

G_MOE = {"w13": (4608, 5120), "w2": (5120, 2304)}  # MoE GEMMs: (N, K)
CONFIGS = {  # name: (BLOCK_N weights, BLOCK_M tokens, warps, stages, SUBS)
    "n128m128w4s4": (128, 128, 4, 4, 1), "n128m128w8s4": (128, 128, 8, 4, 1), "n256m128w8s3": (256, 128, 8, 3, 1),
    "n128m256w8s3": (128, 256, 8, 3, 1), "n128m128w8s3x2": (128, 128, 8, 3, 2), "n64m128w4s4": (64, 128, 4, 4, 1),
    "n128m64w4s4": (128, 64, 4, 4, 1), "n128m32w4s4": (128, 32, 4, 4, 1), "n64m64w4s4": (64, 64, 4, 4, 1),
    "n256m64w8s4": (256, 64, 8, 4, 1), "n256m128w8s4": (256, 128, 8, 4, 1), "n128m64w4s6": (128, 64, 4, 6, 1),
}


def dequant(aq, sa, fp4_order: bool, bm: int = 8, bk: int = 512, warps: int = 4) -> torch.Tensor:
    return G._dequant_activations(aq, sa.view(torch.uint8), fp4_order, bm, bk, warps)


def dequant_sweep(rec):
    """The activation pass alone: GB/s (1 byte + its scale read, 2 written per element) per tile config."""
    for M, K, perm in ((49152, 5120, True), (49152, 5120, False), (4096, 5120, False)):
        aq, sa = rand_fp8(M, K), rand_ue8m0(M, K // 32)
        for bm, bk, warps in ((32, 128, 4), (64, 128, 4), (16, 256, 4), (32, 256, 8), (8, 512, 4), (64, 64, 4)):
            t = ms(lambda: dequant(aq, sa, perm, bm, bk, warps))
            rec.add(kind="dequant", M=M, K=K, permute=perm, config=f"{bm}x{bk}w{warps}", us=t * 1e3,
                    gbs=M * K * (3 + 1 / 32) / t / 1e6)


def swapab_gemm(x, bq, sb, d, layout, group, w_fp4, cfg, fp4_asm=True, scale_words=True):
    bn, bm, nw, ns, subs = cfg
    G._swapab_gemm(x, None, bq.view(torch.uint8) if w_fp4 else bq, sb.view(torch.uint8), d, int(layout), group, w_fp4,
                   dict(BLOCK_N=bn, BLOCK_M=bm, GROUP_M=8, num_warps=nw, num_stages=ns, SUBS=subs, FP4_ASM=fp4_asm,
                        SCALE_WORDS=scale_words))


def run_variants(rec, kind, name, flops, x, bq, sb, layout, group, w_fp4, old_out, M, N, configs):
    d = torch.zeros(M, N, dtype=torch.bfloat16, device="cuda")
    for cname in configs:
        cfg = CONFIGS[cname]
        if layout == LAYOUT_CONTIGUOUS and cfg[1] > 128:
            continue
        try:
            d.zero_()
            swapab_gemm(x, bq, sb, d, layout, group, w_fp4, cfg)
            rows = group >= 0 if group is not None else slice(None)
            diff = calc_diff(d[rows].float(), old_out[rows].float())
            t = ms(lambda: swapab_gemm(x, bq, sb, d, layout, group, w_fp4, cfg))
            rec.add(kind=kind, name=name, variant=cname, tflops=flops / t / 1e9, ms=t, diff_vs_current=diff)
        except Exception as e:  # noqa: BLE001 - a failing config is a result too
            rec.add(kind=kind, name=name, variant=cname, error=repr(e)[:400])


def routed_layout(E, T, topk, align, gen):
    """Expert ids per row of a uniformly routed prefill (T tokens x topk over E experts), each expert's segment
    padded to `align`: the contiguous layout the runtime builds. Returns (rows per expert, layout)."""
    picks = torch.rand(T, E, generator=gen).topk(topk, dim=1).indices.flatten()
    rows = torch.bincount(picks, minlength=E).tolist()
    padded = [-(-m // align) * align for m in rows]
    ids = torch.cat([torch.tensor([g] * m + [-1] * (p - m), dtype=torch.int32) for g, (m, p) in enumerate(zip(rows, padded))])
    return rows, ids.cuda()


def real_moe(rec, E, T, name, N, K, aligns=(128, 64, 32),
             configs=("n128m128w4s4", "n64m128w4s4", "n128m64w4s4", "n128m32w4s4", "n64m64w4s4"), conversions=(False, True),
             scale_words=(True,)):
    """The MoE GEMM at the prefill's real routing: the legacy kernel (align 128) vs swap-AB at each alignment and
    tile, its FP4 conversion in integer ops (_int) or inline PTX (_ptx), its scales loaded as words or as bytes
    (_bytes; before session 5)."""
    bq = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, device="cuda")
    bs = rand_ue8m0(E, N, K // 32)
    for align in aligns:
        rows, layout = routed_layout(E, T, 6, align, torch.Generator().manual_seed(1))
        M = layout.numel()
        flops = 2 * sum(rows) * N * K
        aq, sa = rand_fp8(M, K), rand_ue8m0(M, K // 32)
        d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        base = dict(kind="moe_real", name=name, E=E, T=T, align=align, rows=sum(rows), padded_rows=M)
        if align == 128:
            legacy = G.gemm_kernel_config(G._CONTIGUOUS, M, 32, True)
            t = ms(lambda: G._gemm(G._CONTIGUOUS, (aq, sa), (bq, bs), d, None, layout, None, True, config=legacy))
            rec.add(**base, variant="current", tflops=flops / t / 1e9, ms=t)
            old = d.clone()
        x = dequant(aq, sa, True)
        rec.add(**base, variant="dequant_only", ms=ms(lambda: dequant(aq, sa, True)))
        for cname, fp4_asm, words in itertools.product(configs, conversions, scale_words):
            bn, bm, nw, ns, subs = cfg = CONFIGS[cname]
            if align % bm:
                continue
            variant = cname + ("_ptx" if fp4_asm else "_int") + ("" if words else "_bytes")
            try:
                swapab_gemm(x, bq, bs, d, LAYOUT_CONTIGUOUS, layout, True, cfg, fp4_asm, words)
                valid = layout >= 0
                diff = calc_diff(d[valid].float(), old[valid].float()) if align == 128 else float("nan")
                t = ms(lambda: swapab_gemm(x, bq, bs, d, LAYOUT_CONTIGUOUS, layout, True, cfg, fp4_asm, words))
                rec.add(**base, variant=variant, tflops=flops / t / 1e9, ms=t, diff_vs_current=diff)
            except Exception as e:  # noqa: BLE001
                rec.add(**base, variant=variant, error=repr(e)[:300])


DECODE_CONFIGS = {  # name: (BLOCK_N weights, BLOCK_M tokens, warps, stages, SUBS)
    "n128m16s4": (128, 16, 4, 4, 1), "n128m16s6": (128, 16, 4, 6, 1), "n64m16s4": (64, 16, 4, 4, 1),
    "n64m16s6": (64, 16, 4, 6, 1), "n128m16s3x2": (128, 16, 4, 3, 2), "n256m16w8s4": (256, 16, 8, 4, 1),
    "n128m32s4": (128, 32, 4, 4, 1), "n64m32s4": (64, 32, 4, 4, 1), "n128m64s4": (128, 64, 4, 4, 1),
}


def decode(rec, copy_gbs):
    """Session 5: the masked FP8 x FP4 MoE GEMM (decode) and dense FP8 GEMMs of a few rows on swap-AB with the
    activations dequantized per tile (X_FP8), against gemm_kernel's 64-row bf16 tiles (the previous default) and
    its 16-row FP8 MMAs. Weight bytes / time against a device copy measured in the same run."""
    gen = torch.Generator().manual_seed(5)
    legacy = {"gk64_bf16": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4, BF16_MMA=True),
              "gk16_fp8": dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=6, BF16_MMA=False)}

    def timed(base, run, weight_bytes, ref):
        def one(variant, cfg):
            try:
                out = run(cfg).clone()
                diff = calc_diff(out.float(), ref.float())
                t = ms(lambda: run(cfg))
                rec.add(**base, variant=variant, us=t * 1e3, weight_gbs=weight_bytes / t / 1e6,
                        frac_of_copy=weight_bytes / t / 1e6 / copy_gbs, diff_vs_gk64=diff)
            except Exception as e:  # noqa: BLE001 - a failing config is a result too
                rec.add(**base, variant=variant, error=repr(e)[:400])
        return one

    for E, expected_m in ((384, 1), (384, 4), (96, 8), (96, 32)):
        max_m = 64 if expected_m <= 4 else 128
        masked = torch.clamp(torch.poisson(torch.full((E,), float(expected_m)), generator=gen), 0, max_m).int()
        masked_m = masked.cuda()
        for name, (N, K) in G_MOE.items():
            a = (rand_fp8(E, max_m, K), rand_ue8m0(E, max_m, K // 32).view(torch.uint8))
            bq = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, device="cuda")
            bs = rand_ue8m0(E, N, K // 32).view(torch.uint8)
            d = torch.zeros(E, max_m, N, dtype=torch.bfloat16, device="cuda")
            valid = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]

            def run(cfg):
                if cfg.get("SWAP_AB"):
                    G._launch_swapab(G._MASKED, a, (bq, bs), d, masked_m, True, cfg)
                else:
                    G._gemm(G._MASKED, a, (bq, bs), d, None, masked_m, None, True, expected_m=expected_m, config=cfg)
                return d[valid]  # a view: timing runs do not copy

            ref = run(legacy["gk64_bf16"]).clone()
            active = int((masked > 0).sum())  # experts with no rows are skipped: their weights are not read
            one = timed(dict(kind="masked", name=name, E=E, active=active, expected_m=expected_m, rows=int(masked.sum()),
                             N=N, K=K), run, (bq.numel() + bs.numel()) * active // E, ref)
            for variant, cfg in legacy.items():
                one(variant, cfg)
            for (cname, (bn, bm, nw, ns, subs)), words in itertools.product(DECODE_CONFIGS.items(), (True, False)):
                one(cname + ("" if words else "_bytes"),
                    dict(BLOCK_N=bn, BLOCK_M=bm, GROUP_M=8, num_warps=nw, num_stages=ns, SUBS=subs, SWAP_AB=True,
                         X_FP8=True, SCALE_WORDS=words))
            one("api_default", G.default_config(G._MASKED, expected_m, 32, True, N, fp4=True))
            del a, bq, bs, d
            torch.cuda.empty_cache()
    for M in (1, 16, 32, 64):
        for name, N, K in (("wq_a", 1280, 5120), ("wq_b", 32768, 1280), ("wkv", 512, 5120), ("wo_b", 5120, 8192),
                           ("shared_w13", 4608, 5120), ("shared_w2", 5120, 2304)):
            op = dense_operands(M, N, K)
            (aq, sa), (bq, sb) = op["v41"]
            a, b = (aq, sa.view(torch.uint8)), (bq, sb.view(torch.uint8))
            d = op["d"]

            def run(cfg):
                if cfg.get("SWAP_AB"):
                    G._launch_swapab(G._DENSE, a, b, d, None, False, cfg)
                else:
                    G._gemm(G._DENSE, (aq, sa), (bq, sb), d, None, None, None, False, config=cfg)
                return d

            ref = run(legacy["gk64_bf16"]).clone()
            one = timed(dict(kind="dense", name=name, M=M, N=N, K=K), run, bq.numel() + sb.numel(), ref)
            for variant, cfg in legacy.items():
                one(variant, cfg)
            for cname, words in itertools.product(("n128m16s4", "n64m16s4", "n64m16s6", "n128m32s4", "n128m64s4"),
                                                  (True, False)):
                bn, bm, nw, ns, subs = DECODE_CONFIGS[cname]
                one(cname + ("" if words else "_bytes"),
                    dict(BLOCK_N=bn, BLOCK_M=bm, GROUP_M=8, num_warps=nw, num_stages=ns, SUBS=subs, SWAP_AB=True,
                         X_FP8=True, SCALE_WORDS=words))


def print_rows_and_dump(rec, out: str) -> None:
    for r in rec.rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    json.dump(rec.rows, open(os.path.join(out, "rows.json"), "w"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/exp_swapab")
    p.add_argument("--dequant-sweep", action="store_true")
    p.add_argument("--real-moe", action="store_true", help="only the MoE GEMMs at real routing, and the API defaults")
    p.add_argument("--fp4-ptx", action="store_true", help="only the MoE GEMMs, FP4 conversion in PTX vs integer ops")
    p.add_argument("--fp4-tiles", action="store_true", help="only the MoE GEMMs with the PTX conversion, per tile shape")
    p.add_argument("--decode", action="store_true", help="masked MoE and few-row dense GEMMs: swap-AB vs gemm_kernel")
    p.add_argument("--scale-words", action="store_true", help="prefill GEMMs, swap-AB scales as words vs bytes")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args.out)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if args.scale_words:  # session 5: the swap-AB scales as 32-bit words (pipelined) against bytes, prefill shapes
        for E, T in ((384, 4096), (96, 16384)):
            for name, (N, K) in G_MOE.items():
                real_moe(rec, E, T, name, N, K, aligns=(128,), conversions=(True,), scale_words=(True, False),
                         configs=("n128m128w4s4", "n64m64w4s4", "n128m64w4s4"))
        for name, N, K in (("shared_w13", 4608, 5120), ("wo_b", 5120, 8192), ("engram_wkv", 25600, 6144),
                           ("wq_a", 1280, 5120), ("wkv", 512, 5120), ("idx_wq_b", 4096, 1280)):
            op = dense_operands(4096, N, K)
            (aq, sa), (bq, sb) = op["v41"]
            x = dequant(aq, sa, False)
            flops = 2 * 4096 * N * K
            t = ms(lambda: G.fp8_gemm_nt((aq, sa), (bq, sb), op["d"]))
            rec.add(kind="dense", name=name, M=4096, variant="api_default", tflops=flops / t / 1e9, ms=t)
            for cname, words in itertools.product(("n128m256w8s3", "n128m128w4s4", "n128m128w8s4"), (True, False)):
                t = ms(lambda: swapab_gemm(x, bq, sb, op["d"], 0, None, False, CONFIGS[cname], True, words))
                rec.add(kind="dense", name=name, M=4096, variant=cname + ("" if words else "_bytes"),
                        tflops=flops / t / 1e9, ms=t)
        print_rows_and_dump(rec, args.out)
        return
    if args.decode:
        from bench_deepgemm import copy_bandwidth_gbs
        copy_gbs = rec.meta["copy_gbs"] = copy_bandwidth_gbs()
        torch.cuda.empty_cache()
        decode(rec, copy_gbs)
        print_rows_and_dump(rec, args.out)
        return
    if args.dequant_sweep:
        dequant_sweep(rec)
        for r in rec.rows:
            print(r["M"], r["K"], r["permute"], r["config"], round(r["us"]), "us", round(r["gbs"]), "GB/s")
        return
    if args.fp4_ptx:  # session 4: the FP4 conversion in PTX against integer ops, at 64 / 256 / 1,024 rows per expert
        for E, T in ((384, 4096), (192, 8192), (96, 16384)):
            for name, (N, K) in G_MOE.items():
                real_moe(rec, E, T, name, N, K, aligns=(128,), configs=("n128m128w4s4", "n128m128w8s4", "n64m128w4s4"))
        print_rows_and_dump(rec, args.out)
        return
    if args.fp4_tiles:  # session 4, after the PTX conversion: tiles that read fewer activation bytes per weight
        for E, T in ((384, 4096), (96, 16384)):
            for name, (N, K) in G_MOE.items():
                real_moe(rec, E, T, name, N, K, aligns=(128,), conversions=(True,),
                         configs=("n128m128w4s4", "n128m64w4s4", "n128m64w4s6", "n256m64w8s4", "n256m128w8s4", "n64m64w4s4"))
        print_rows_and_dump(rec, args.out)
        return
    if args.real_moe:
        for E, T in ((384, 4096), (192, 8192)):
            for name, (N, K) in G_MOE.items():
                real_moe(rec, E, T, name, N, K)
        for name, N, K in (("shared_w13", 4608, 5120), ("wo_b", 5120, 8192), ("wq_b", 32768, 1280), ("wq_a", 1280, 5120),
                           ("wkv", 512, 5120), ("idx_wq_b", 4096, 1280), ("shared_w2", 5120, 2304), ("engram_wkv", 25600, 6144)):
            op = dense_operands(4096, N, K)
            t = ms(lambda: G.fp8_gemm_nt(*op["v41"], op["d"]))
            legacy = G.gemm_kernel_config(G._DENSE, 4096, 32, True)
            t_old = ms(lambda: G._gemm(G._DENSE, *op["v41"], op["d"], None, None, None, False, config=legacy))
            rec.add(kind="dense_api", name=name, M=4096, N=N, K=K, tflops=2 * 4096 * N * K / t / 1e9,
                    tflops_current=2 * 4096 * N * K / t_old / 1e9)
        print_rows_and_dump(rec, args.out)
        return
    dense = [("shared_w13", 4608, 5120), ("wo_b", 5120, 8192), ("wq_b", 32768, 1280), ("wq_a", 1280, 5120)]
    M = 4096
    for name, N, K in dense:
        op = dense_operands(M, N, K)
        (aq, sa), (bq, sb) = op["v41"]
        flops = 2 * M * N * K
        G.fp8_gemm_nt((aq, sa), (bq, sb), op["d"])
        old = op["d"].clone()
        one = torch.ones((), device="cuda")
        bf_a, bf_b = aq.to(torch.bfloat16), bq.to(torch.bfloat16)
        t_old = ms(lambda: G.fp8_gemm_nt((aq, sa), (bq, sb), op["d"]))
        t_deq = ms(lambda: dequant(aq, sa, False))
        t_cub8 = ms(lambda: torch._scaled_mm(aq, bq.t(), one, one, out_dtype=torch.bfloat16))
        t_cub16 = ms(lambda: torch.matmul(bf_a, bf_b.t()))
        rec.add(kind="dense", name=name, variant="peers", M=M, N=N, K=K, tflops_current=flops / t_old / 1e9,
                dequant_ms=t_deq, tflops_cublas_fp8_tensor=flops / t_cub8 / 1e9, tflops_cublas_bf16=flops / t_cub16 / 1e9)
        x = dequant(aq, sa, False)
        run_variants(rec, "dense", name, flops, x, bq, sb, 0, None, False, old, M, N,
                     ["n128m128w8s4", "n128m256w8s3", "n256m128w8s3", "n128m128w4s4", "n128m128w8s3x2"])
    for name, (N, K) in G_MOE.items():
        rows, layout, ends, Mg, (aq, sa), (bq, bs), d = contiguous_operands(96, N, K, gen)
        flops = 2 * sum(rows) * N * K
        G.m_grouped_fp8_fp4_gemm_nt_contiguous((aq, sa), (bq, bs), d, layout)
        old = d.clone()
        t_old = ms(lambda: G.m_grouped_fp8_fp4_gemm_nt_contiguous((aq, sa), (bq, bs), d, layout))
        t_deq = ms(lambda: dequant(aq, sa, True))
        rec.add(kind="contiguous", name=name, variant="peers", rows=sum(rows), padded_rows=Mg, N=N, K=K,
                tflops_current=flops / t_old / 1e9, dequant_ms=t_deq)
        x = dequant(aq, sa, True)
        run_variants(rec, "contiguous", name, flops, x, bq, bs, LAYOUT_CONTIGUOUS, layout, True, old, Mg, N,
                     ["n128m128w8s4", "n256m128w8s3", "n128m128w4s4", "n128m128w8s3x2", "n64m128w4s4", "n128m64w4s4"])
    print("\n| kind | name | variant | TFLOP/s | diff |")
    print("|---|---|---|---|---|")
    for r in rec.rows:
        if r.get("variant") == "peers":
            print(f"| {r['kind']} | {r['name']} | peers | current {r['tflops_current']:.0f}, dequant {r['dequant_ms']*1e3:.0f} us"
                  + (f", cuBLAS fp8 {r['tflops_cublas_fp8_tensor']:.0f}, bf16 {r['tflops_cublas_bf16']:.0f}" if "tflops_cublas_bf16" in r else "") + " | |")
        elif "error" in r:
            print(f"| {r['kind']} | {r['name']} | {r['variant']} | ERROR {r['error'][:120]} | |")
        else:
            print(f"| {r['kind']} | {r['name']} | {r['variant']} | {r['tflops']:.0f} | {r['diff_vs_current']:.1e} |")
    json.dump(rec.rows, open(os.path.join(args.out, "rows.json"), "w"))


if __name__ == "__main__":
    main()
