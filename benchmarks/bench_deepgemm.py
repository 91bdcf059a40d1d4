"""mini-deepgemm benchmark on one GPU: our Triton GEMMs against cuBLAS (through torch) in the same run.

Usage (GPU machine): python3 benchmarks/bench_deepgemm.py [--out DIR] [--sweep] [--tilelang]
Prints a markdown table last; writes results.json (every measurement, hardware, versions, date) to --out.
--tilelang: instead, our TileLang kernels (gemm_tilelang.py) against our Triton kernel and the cuBLAS peers
at the shapes of docs/reports/deepgemm-tilelang.md, plus a small TileLang tile/stage sweep.

Peers, measured on the same operands' shapes in the same process:
- cublas_fp8_tensor: torch._scaled_mm, per-tensor FP8 scales (no fine-grained scaling: the ceiling proxy);
- cublas_fp8_block:  torch._scaled_mm with 1x128 activation / 128x128 weight fp32 scales;
- cublas_bf16:       torch.matmul in bf16;
- grouped: torch._scaled_grouped_mm (FP8, rowwise scales) and torch._grouped_mm (bf16);
- triton_fp8_tensor: a plain Triton FP8 GEMM written like ours but without fine-grained scales (the fp32
  accumulator stays in the MMA), to separate what the scaling costs from what Triton itself reaches.
Timing: triton.testing.do_bench (median, L2 flushed before every call), after its warm-up; --graph: calls replayed
from a CUDA graph (GPU time without host launch gaps; L2 not flushed), except the masked GEMM's copy peer (always
do_bench: see copy_bandwidth_gbs).
Operands are random bytes/values (never zeros); timings do not depend on the values, except that the FP4 expert
weights' scales are drawn as a checkpoint's (bytes 116-128) and the grouped calls state that bound, as the engine
does, which selects the folded conversion (session 16; before it the scales were bytes 120-133 and no bound).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics

import torch
import triton
import triton.language as tl
import triton.testing

from mini_deepgemm import gemm as G
from mini_deepgemm._backend import gluon_runs_on
from mini_deepgemm.gemm_kernel import grouped_tile

DENSE_SHAPES = {  # name: (N, K)
    "wq_a": (1280, 5120), "wq_b": (32768, 1280), "wkv": (512, 5120), "wo_b": (5120, 8192),
    "idx_wq_b": (4096, 1280), "shared_w13": (4608, 5120), "shared_w2": (5120, 2304), "engram_wkv": (25600, 6144),
}
MOE_SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}
SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages, BF16_MMA, BLOCK_K)
    "v41": [(128, 128, 8, 4, True, 128), (128, 128, 8, 4, True, 64), (128, 128, 8, 4, True, 32),
            (64, 128, 4, 4, True, 128)],
    "v3": [(64, 128, 4, 4, False, 128), (64, 128, 4, 3, False, 128), (128, 128, 8, 4, False, 128)],
    "fp4_contiguous": [(128, 128, 8, 4, True, 128), (128, 128, 8, 4, True, 64), (128, 256, 8, 4, True, 32)],
    "fp4_masked": [(16, 128, 4, 6, False, 32), (16, 128, 4, 4, True, 128), (64, 128, 4, 4, True, 128)],
}


@triton.jit
def fp8_pertensor_gemm_kernel(a_ptr, b_ptr, d_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """D = A @ B^T for e4m3 A [M, K], B [N, K] (K-major), bf16 D; same tile order and loads as
    gemm_kernel.scaled_gemm_nt_kernel, the accumulator stays in the MMA."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M).to(tl.int64)[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + (offs_n % N).to(tl.int64)[:, None] * K + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_K):
        acc = tl.dot(tl.load(a_ptrs), tl.trans(tl.load(b_ptrs)), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(d_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16), mask=mask)


def triton_fp8_pertensor(a, b, d):
    """Best of two tile configs (timed once per shape by the caller)."""
    M, K = a.shape
    N = b.shape[0]
    runs = []
    for bm, bn, nw, ns in ((128, 128, 8, 4), (128, 256, 8, 3)):
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        runs.append(lambda bm=bm, bn=bn, nw=nw, ns=ns, grid=grid: fp8_pertensor_gemm_kernel[grid](
            a, b, d, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, num_warps=nw, num_stages=ns))
    return min(ms(r) for r in runs)


GRAPH_TIMING = False  # --graph: time calls replayed from a CUDA graph (GPU time; no L2 flush between calls)


def ms(fn) -> float:
    if GRAPH_TIMING:
        return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def cfg_dict(c):
    return dict(BLOCK_M=c[0], BLOCK_N=c[1], GROUP_M=8, num_warps=c[2], num_stages=c[3], BF16_MMA=c[4], BLOCK_K=c[5])


def rand_fp8(*shape: int, device: str = "cuda") -> torch.Tensor:
    """Random e4m3 values (a normal times 4), filled one [.., K] matrix at a time: a float32 temporary of the whole
    tensor (384 experts x 4,608 x 5,120: 34 GiB) ran an H100 out of memory beside a benchmark's operands (session 56
    run 3)."""
    out = torch.empty(*shape, dtype=torch.float8_e4m3fn, device=device)
    for matrix in out.view(-1, *shape[-2:]) if len(shape) > 2 else (out,):
        matrix.copy_(torch.randn(matrix.shape, device=device) * 4)
    return out


def rand_ue8m0(*shape):
    return torch.randint(120, 134, shape, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)


def rand_fp4_weight_scales(*shape, low=116):
    """UE8M0 scales of FP4 expert weights: a checkpoint's are amax / 6, bytes near 120 (at most 128 for any weight
    up to 12 in magnitude), so the grouped GEMMs get the bound 128 as the engine gives it (KernelWeights.fp4_scale_max)
    and run the folded conversion. Bytes low..128 (bench_fp4_e4m3_route.py takes 118: a span the FP8-MMA route
    folds)."""
    return torch.randint(low, 129, shape, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)


FP4_SCALE_BOUND = 128


def rand_fp32_scale(*shape):
    return torch.rand(*shape, device="cuda") + 0.5


class Recorder:
    def __init__(self, out_dir: str):
        self.rows: list[dict] = []
        self.path = os.path.join(out_dir, "results.json")
        self.meta = {
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            # which kernels the routed calls take: the Gluon kernels, or the Triton route (MINI_DEEPGEMM_GLUON=0,
            # another triton release, or not Hopper)
            "route": "gluon" if gluon_runs_on(torch.empty(1, device="cuda")) else "triton",
            "timing": ("triton.testing.do_bench_cudagraph median, rep 40 ms (GPU time, L2 not flushed); the masked "
                       "copy peer do_bench" if GRAPH_TIMING
                       else "triton.testing.do_bench median, warmup 10 ms, rep 40 ms, L2 flushed per call"),
        }

    def add(self, **row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        with open(self.path, "w") as f:
            json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)


# --------------------------------------------------------------------------- dense
def dense_operands(M, N, K):
    a, b = rand_fp8(M, K), rand_fp8(N, K)
    return dict(
        a=a, b=b,
        v41=((a, rand_ue8m0(M, K // 32)), (b, rand_ue8m0(N // 32, K // 32))),
        v3=((a, rand_fp32_scale(M, K // 128)), (b, rand_fp32_scale(N // 128, K // 128))),
        d=torch.empty(M, N, dtype=torch.bfloat16, device="cuda"),
    )


def blockwise_scaled_mm(a, b, M, N, K):
    """cuBLAS 1x128 x 128x128 through torch._scaled_mm; returns a callable or None if this torch refuses."""
    sa = torch.rand(K // 128, M, device="cuda").t()  # [M, K/128], M-major as cuBLAS wants
    l4 = -(-(K // 128) // 4) * 4
    candidates = [torch.rand(N // 128, l4, device="cuda").t()[: K // 128], torch.rand(K // 128, N // 128, device="cuda"),
                  torch.rand(N // 128, K // 128, device="cuda").t()]
    for sb in candidates:
        try:
            torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
            return lambda: torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        except (RuntimeError, ValueError):
            continue
    return None


def bench_dense(rec, M, name, N, K, configs):
    op = dense_operands(M, N, K)
    flops = 2 * M * N * K
    one = torch.ones((), device="cuda")
    bf_a, bf_b = op["a"].to(torch.bfloat16), op["b"].to(torch.bfloat16)
    t = {
        "ours_v41": ms(lambda: G._gemm(G._DENSE, *op["v41"], op["d"], None, None, None, False, config=configs["v41"])),
        "ours_v3": ms(lambda: G._gemm(G._DENSE, *op["v3"], op["d"], None, None, None, False, config=configs["v3"])),
        "cublas_fp8_tensor": ms(lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)),
        "cublas_bf16": ms(lambda: torch.matmul(bf_a, bf_b.t())),
    }
    try:
        t["triton_fp8_tensor"] = triton_fp8_pertensor(op["a"], op["b"], op["d"])
    except Exception as e:  # noqa: BLE001 - a reference column, not worth losing the row for
        print("triton per-tensor reference failed:", repr(e)[:300])
        t["triton_fp8_tensor"] = float("nan")
    blockwise = blockwise_scaled_mm(op["a"], op["b"], M, N, K)
    t["cublas_fp8_block"] = ms(blockwise) if blockwise else float("nan")
    rec.add(kind="dense", name=name, M=M, N=N, K=K, **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()})


# --------------------------------------------------------------------------- grouped
def moe_layout(G_, gen, rows_range=(128, 1024)):
    """Rows per expert uniform in rows_range (inclusive), each segment padded to 128: (rows, layout, ends)."""
    rows = torch.randint(rows_range[0], rows_range[1] + 1, (G_,), generator=gen).tolist()
    padded = [-(-m // 128) * 128 for m in rows]
    ids = torch.cat([torch.tensor([g] * m + [-1] * (p - m), dtype=torch.int32) for g, (m, p) in enumerate(zip(rows, padded))])
    ends = torch.tensor(padded, dtype=torch.int32).cumsum(0).to(torch.int32)
    return rows, ids.cuda(), ends.cuda()


def contiguous_operands(G_, N, K, gen, rows_range=(128, 1024)):
    """A random MoE contiguous layout (moe_layout) and its operands: FP8 rows with UE8M0 scales, packed FP4
    expert weights with UE8M0 scales, a bf16 output. Returns (rows, layout, ends, M, a, b, d)."""
    rows, layout, ends = moe_layout(G_, gen, rows_range)
    M = layout.numel()
    a = (rand_fp8(M, K), rand_ue8m0(M, K // 32))
    b = (torch.randint(0, 256, (G_, N, K // 2), dtype=torch.uint8, device="cuda"), rand_fp4_weight_scales(G_, N, K // 32))
    return rows, layout, ends, M, a, b, torch.empty(M, N, dtype=torch.bfloat16, device="cuda")


def bench_contiguous(rec, G_, name, N, K, cfg, gen):
    rows, layout, ends, M, (a, sa), (bq, bs), d = contiguous_operands(G_, N, K, gen)
    flops = 2 * sum(rows) * N * K
    t = {"ours_fp8_fp4": ms(lambda: G._gemm(G._CONTIGUOUS, (a, sa), (bq, bs), d, None, layout, None, True, config=cfg,
                                            weight_scale_max=FP4_SCALE_BOUND))}
    bq = None  # frees the FP4 weights before the FP8 copy (a rebinding: the timed lambda above has already run)
    w8 = rand_fp8(G_, N, K)
    s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(G_, N, device="cuda") + 0.5
    try:
        t["scaled_grouped_mm_fp8"] = ms(lambda: torch._scaled_grouped_mm(a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16))
    except (RuntimeError, ValueError, TypeError) as e:
        print("scaled_grouped_mm failed:", repr(e)[:300])
        t["scaled_grouped_mm_fp8"] = float("nan")
    w8 = None
    a16, w16 = a.to(torch.bfloat16), torch.randn(G_, N, K, device="cuda", dtype=torch.bfloat16)
    try:
        t["grouped_mm_bf16"] = ms(lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=ends))
    except (RuntimeError, ValueError, TypeError) as e:
        print("grouped_mm failed:", repr(e)[:300])
        t["grouped_mm_bf16"] = float("nan")
    rec.add(kind="contiguous", name=name, G=G_, rows=sum(rows), padded_rows=M, N=N, K=K,
            **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()})


def copy_bandwidth_gbs() -> float:
    """The device copy that the masked GEMM's weight streaming is compared with, always timed by do_bench: captured
    in a CUDA graph (--graph), y.copy_(x) becomes a memcpy node that a copy engine runs, not SM copy kernels, and
    read 2,770 GB/s against the ~4,270 the SMs reach (session 11 run 1); a ~2 ms copy does not wait for its launch."""
    x = torch.randint(0, 256, (4 << 30,), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=40, return_mode="median")
    return 2 * x.numel() / t / 1e6  # read + write


def masked_operands(G_, expected_m, N, K, max_m=128):
    """The masked case's operands: Poisson(expected_m) used rows per group (at least 1, at most max_m; on the CPU and
    as the device's masked_m), FP8 rows [G, max_m, K] with UE8M0 scales, packed FP4 weights with checkpoint-like
    scales, a bf16 output. Returns (masked, masked_m, (a, sa), (bq, bs), d).
    The row counts come from a generator seeded by (G, expected_m) alone, so that every benchmark, and w13 and w2,
    time the same loads: at ~32 rows about half the experts take a second token tile, and two benchmarks' own draws
    (3,014 and 3,117 rows) had put w13 at 0.47 and 0.42 of the copy rate (sessions 39 and 40)."""
    rows_gen = torch.Generator().manual_seed(1_000 * G_ + expected_m)
    masked = torch.clamp(torch.poisson(torch.full((G_,), float(expected_m)), generator=rows_gen), 1, max_m).int()
    a, sa = rand_fp8(G_, max_m, K), rand_ue8m0(G_, max_m, K // 32)
    bq = torch.randint(0, 256, (G_, N, K // 2), dtype=torch.uint8, device="cuda")
    bs = rand_fp4_weight_scales(G_, N, K // 32)
    d = torch.empty(G_, max_m, N, dtype=torch.bfloat16, device="cuda")
    return masked, masked.cuda(), (a, sa), (bq, bs), d


def bench_masked(rec, G_, expected_m, name, N, K, cfg, copy_gbs):
    masked, masked_m, (a, sa), (bq, bs), d = masked_operands(G_, expected_m, N, K)
    t = ms(lambda: G._gemm(G._MASKED, (a, sa), (bq, bs), d, None, masked_m, None, True, expected_m=expected_m, config=cfg,
                           weight_scale_max=FP4_SCALE_BOUND))
    weight_bytes = bq.numel() + bs.numel()
    gbs = weight_bytes / t / 1e6
    rec.add(kind="masked", name=name, G=G_, expected_m=expected_m, rows=int(masked.sum()), N=N, K=K, us=t * 1e3,
            weight_gbs=gbs, copy_gbs=copy_gbs, frac_of_copy=gbs / copy_gbs,
            tflops=2 * int(masked.sum()) * N * K / t / 1e9)


# --------------------------------------------------------------------------- config sweep
def time_configs(rec, family, run, figure) -> dict:
    """Time run(cfg) for each candidate of the family (a config that fails to compile is recorded and skipped);
    return the fastest as a config dict. figure(ms) -> dict of the reported figures."""
    res = {}
    for c in SWEEP[family]:
        try:
            res[c] = ms(lambda: run(cfg_dict(c)))
            rec.add(kind="sweep", family=family, config=c, **figure(res[c]))
        except Exception as e:  # noqa: BLE001 - a candidate may not compile; the sweep goes on
            rec.add(kind="sweep", family=family, config=c, error=repr(e)[:200])
    return cfg_dict(min(res, key=res.get))


def sweep(rec) -> dict:
    """Time each candidate tile config on one representative shape per family; return the fastest."""
    gen = torch.Generator().manual_seed(0)
    best = {}
    M, N, K = 4096, 4608, 5120
    op = dense_operands(M, N, K)
    for fam in ("v41",):  # the V3 candidates were swept in an earlier run (see the report)
        best[fam] = time_configs(rec, fam, lambda cfg: G._gemm(G._DENSE, *op[fam], op["d"], None, None, None, False, config=cfg),
                                 lambda t: {"tflops": 2 * M * N * K / t / 1e9})
    rows, layout, _ = moe_layout(96, gen)
    Mc = layout.numel()
    a, sa = rand_fp8(Mc, K), rand_ue8m0(Mc, K // 32)
    bq, bs = torch.randint(0, 256, (96, N, K // 2), dtype=torch.uint8, device="cuda"), rand_ue8m0(96, N, K // 32)
    d = torch.empty(Mc, N, dtype=torch.bfloat16, device="cuda")
    best["fp4_contiguous"] = time_configs(
        rec, "fp4_contiguous", lambda cfg: G._gemm(G._CONTIGUOUS, (a, sa), (bq, bs), d, None, layout, None, True, config=cfg),
        lambda t: {"tflops": 2 * sum(rows) * N * K / t / 1e9})
    am, sam = rand_fp8(96, 128, K), rand_ue8m0(96, 128, K // 32)
    dm = torch.empty(96, 128, N, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.full((96,), 8, dtype=torch.int32, device="cuda")
    best["fp4_masked"] = time_configs(
        rec, "fp4_masked", lambda cfg: G._gemm(G._MASKED, (am, sam), (bq, bs), dm, None, masked_m, None, True, expected_m=8, config=cfg),
        lambda t: {"weight_gbs": (bq.numel() + bs.numel()) / t / 1e6})
    return best


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def summary(rec) -> str:
    lines = ["| shape | M | ours V4.1 (1x32) | ours V3 (1x128) | Triton FP8 tensor | cuBLAS FP8 tensor | cuBLAS FP8 block | cuBLAS bf16 | V4.1/tensor | V3/tensor | V3/block |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    r41, r3, r3b = [], [], []
    for r in rec.rows:
        if r["kind"] != "dense":
            continue
        a, b, c = r["tflops_ours_v41"] / r["tflops_cublas_fp8_tensor"], r["tflops_ours_v3"] / r["tflops_cublas_fp8_tensor"], r["tflops_ours_v3"] / r["tflops_cublas_fp8_block"]
        r41.append(a); r3.append(b); r3b.append(c)
        lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['M']} | {r['tflops_ours_v41']:.0f} | {r['tflops_ours_v3']:.0f} | {r['tflops_triton_fp8_tensor']:.0f} | {r['tflops_cublas_fp8_tensor']:.0f} | "
                     f"{r['tflops_cublas_fp8_block']:.0f} | {r['tflops_cublas_bf16']:.0f} | {a:.2f} | {b:.2f} | {c:.2f} |")
    lines.append(f"| geomean | | | | | | | | {geomean(r41):.2f} | {geomean(r3):.2f} | {geomean(r3b):.2f} |")
    lines += ["", "| MoE contiguous | G | rows | ours FP8xFP4 | scaled_grouped_mm FP8 | grouped_mm bf16 | ours/scaled_grouped |", "|---|---|---|---|---|---|---|"]
    for r in rec.rows:
        if r["kind"] == "contiguous":
            lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['G']} | {r['rows']} | {r['tflops_ours_fp8_fp4']:.0f} | {r['tflops_scaled_grouped_mm_fp8']:.0f} | "
                         f"{r['tflops_grouped_mm_bf16']:.0f} | {r['tflops_ours_fp8_fp4'] / r['tflops_scaled_grouped_mm_fp8']:.2f} |")
    lines += ["", "| MoE masked | G | expected_m | us | weight GB/s | copy GB/s | fraction |", "|---|---|---|---|---|---|---|"]
    for r in rec.rows:
        if r["kind"] == "masked":
            lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['G']} | {r['expected_m']} | {r['us']:.0f} | {r['weight_gbs']:.0f} | {r['copy_gbs']:.0f} | {r['frac_of_copy']:.2f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- TileLang against Triton
TL_DENSE = ("wq_b", "wo_b", "shared_w13")
TL_SWEEP = {  # recipe: (BLOCK_M, BLOCK_N, stages) candidates, timed at shared_w13 M=4096
    "v3": [(128, 128, 4), (128, 128, 5), (128, 128, 6)],
    "v41": [(128, 128, 8), (128, 128, 12), (128, 128, 16)],
}


def tilelang_run(layout, a, b, d, group_arg, b_fp4, tiles=None):
    from mini_deepgemm import gemm_tilelang

    recipe, _ = G._validate(layout, a, b, d, None, group_arg, None, b_fp4)
    return lambda: gemm_tilelang.launch(layout, a, b, d, group_arg, recipe[1], recipe[2], b_fp4, tiles)


def bench_tilelang_dense(rec, M, name, N, K):
    op = dense_operands(M, N, K)
    flops = 2 * M * N * K
    one = torch.ones((), device="cuda")
    bf_a, bf_b = op["a"].to(torch.bfloat16), op["b"].to(torch.bfloat16)
    bq4 = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")
    fp4 = (op["v41"][0], (bq4, rand_ue8m0(N, K // 32)))
    t = {
        "triton_v3": ms(lambda: G._gemm(G._DENSE, *op["v3"], op["d"], None, None, None, False, backend="triton")),
        "tilelang_v3": ms(tilelang_run(G._DENSE, *op["v3"], op["d"], None, False)),
        "triton_v41": ms(lambda: G._gemm(G._DENSE, *op["v41"], op["d"], None, None, None, False, backend="triton")),
        "tilelang_v41": ms(tilelang_run(G._DENSE, *op["v41"], op["d"], None, False)),
        "triton_fp4": ms(lambda: G._gemm(G._DENSE, *fp4, op["d"], None, None, None, True, backend="triton")),
        "tilelang_fp4": ms(tilelang_run(G._DENSE, *fp4, op["d"], None, True)),
        "cublas_fp8_tensor": ms(lambda: torch._scaled_mm(op["a"], op["b"].t(), one, one, out_dtype=torch.bfloat16)),
        "cublas_bf16": ms(lambda: torch.matmul(bf_a, bf_b.t())),
    }
    blockwise = blockwise_scaled_mm(op["a"], op["b"], M, N, K)
    t["cublas_fp8_block"] = ms(blockwise) if blockwise else float("nan")
    rec.add(kind="tl_dense", name=name, M=M, N=N, K=K, **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()})


def bench_tilelang_contiguous(rec, G_, name, N, K, gen):
    rows, layout, ends, M, (a, sa), (bq, bs), d = contiguous_operands(G_, N, K, gen)
    flops = 2 * sum(rows) * N * K
    t = {"triton_fp8_fp4": ms(lambda: G._gemm(G._CONTIGUOUS, (a, sa), (bq, bs), d, None, layout, None, True, backend="triton")),
         "tilelang_fp8_fp4": ms(tilelang_run(G._CONTIGUOUS, (a, sa), (bq, bs), d, layout, True))}
    bq = None  # frees the FP4 weights before the FP8 copy (as in bench_contiguous)
    w8 = rand_fp8(G_, N, K)
    s_a, s_b = torch.rand(M, device="cuda") + 0.5, torch.rand(G_, N, device="cuda") + 0.5
    t["scaled_grouped_mm_fp8"] = ms(lambda: torch._scaled_grouped_mm(a, w8.transpose(-2, -1), s_a, s_b, offs=ends, out_dtype=torch.bfloat16))
    w8s = rand_ue8m0(G_, N // 32, K // 32)
    t["triton_fp8_v41"] = ms(lambda: G._gemm(G._CONTIGUOUS, (a, sa), (w8, w8s), d, None, layout, None, False, backend="triton"))
    t["tilelang_fp8_v41"] = ms(tilelang_run(G._CONTIGUOUS, (a, sa), (w8, w8s), d, layout, False))
    w8 = None
    a16, w16 = a.to(torch.bfloat16), torch.randn(G_, N, K, device="cuda", dtype=torch.bfloat16)
    t["grouped_mm_bf16"] = ms(lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=ends))
    rec.add(kind="tl_contiguous", name=name, G=G_, rows=sum(rows), padded_rows=M, N=N, K=K,
            **{f"tflops_{k}": flops / v / 1e9 for k, v in t.items()})


def tilelang_sweep(rec):
    M, (N, K) = 4096, DENSE_SHAPES["shared_w13"]
    op = dense_operands(M, N, K)
    for recipe, candidates in TL_SWEEP.items():
        for tiles in candidates:
            try:
                t = ms(tilelang_run(G._DENSE, *op[recipe], op["d"], None, False, tiles))
                rec.add(kind="tl_sweep", recipe=recipe, tiles=tiles, M=M, N=N, K=K, tflops=2 * M * N * K / t / 1e9)
            except Exception as e:  # noqa: BLE001 - a candidate may not compile; the sweep goes on
                rec.add(kind="tl_sweep", recipe=recipe, tiles=tiles, error=repr(e)[:300])


def tilelang_summary(rec) -> str:
    cols = ["triton_v3", "tilelang_v3", "triton_v41", "tilelang_v41", "triton_fp4", "tilelang_fp4",
            "cublas_fp8_tensor", "cublas_fp8_block", "cublas_bf16"]
    lines = ["| shape | M | " + " | ".join(cols) + " | TL v3/tensor | TL v41/tensor | TL fp4/tensor |",
             "|---|---|" + "---|" * (len(cols) + 3)]
    for r in rec.rows:
        if r["kind"] == "tl_dense":
            ten = r["tflops_cublas_fp8_tensor"]
            lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['M']} | " + " | ".join(f"{r['tflops_' + c]:.0f}" for c in cols)
                         + f" | {r['tflops_tilelang_v3'] / ten:.2f} | {r['tflops_tilelang_v41'] / ten:.2f} | {r['tflops_tilelang_fp4'] / ten:.2f} |")
    gcols = ["triton_fp8_fp4", "tilelang_fp8_fp4", "triton_fp8_v41", "tilelang_fp8_v41", "scaled_grouped_mm_fp8", "grouped_mm_bf16"]
    lines += ["", "| MoE contiguous | G | rows | " + " | ".join(gcols) + " | TL fp4/scaled_grouped |", "|---|---|---|" + "---|" * (len(gcols) + 1)]
    for r in rec.rows:
        if r["kind"] == "tl_contiguous":
            lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['G']} | {r['rows']} | " + " | ".join(f"{r['tflops_' + c]:.0f}" for c in gcols)
                         + f" | {r['tflops_tilelang_fp8_fp4'] / r['tflops_scaled_grouped_mm_fp8']:.2f} |")
    lines += ["", "| sweep | tiles (BM, BN, stages) | TFLOP/s |", "|---|---|---|"]
    for r in rec.rows:
        if r["kind"] == "tl_sweep":
            lines.append(f"| {r['recipe']} | {r['tiles']} | {r.get('tflops', float('nan')):.0f} |")
    return "\n".join(lines)


def tilelang_main(args, rec):
    import tilelang

    from mini_deepgemm import gemm_tilelang

    rec.meta["tilelang"] = tilelang.__version__
    rec.meta["tilelang_tiles"] = {"v3": gemm_tilelang.default_tiles(128), "ue8m0": gemm_tilelang.default_tiles(32)}
    gen = torch.Generator().manual_seed(0)
    for M in args.m:
        for name in TL_DENSE:
            bench_tilelang_dense(rec, M, name, *DENSE_SHAPES[name])
            torch.cuda.empty_cache()
    for name, (N, K) in MOE_SHAPES.items():
        bench_tilelang_contiguous(rec, 96, name, N, K, gen)
        torch.cuda.empty_cache()
    if args.sweep:
        tilelang_sweep(rec)
    return tilelang_summary(rec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--sweep", action="store_true", help="pick tile configs by timing candidates first")
    p.add_argument("--m", type=int, nargs="*", default=[4096, 16384])
    p.add_argument("--tilelang", action="store_true", help="TileLang kernels against Triton and cuBLAS")
    p.add_argument("--graph", action="store_true",
                   help="GPU time from CUDA graphs: under do_bench, calls of ~50-70 us at M = 4,096 wait for their "
                        "host launch (session 10, deepgemm-gluon-v3.md)")
    args = p.parse_args()
    global GRAPH_TIMING
    GRAPH_TIMING = args.graph
    os.makedirs(args.out, exist_ok=True)
    rec = Recorder(args.out)
    if args.tilelang:
        table = tilelang_main(args, rec)
        with open(os.path.join(args.out, "table_tilelang.md"), "w") as f:
            f.write(table + "\n")
        print(table)
        return
    best = sweep(rec) if args.sweep else {}
    # None: the API's own choice per shape (gemm.default_config). Until session 5 this passed the config of an
    # N-less 4096-row call, i.e. gemm_kernel's tiles for every V4.1 shape, so the table missed the swap-AB kernel.
    configs = {"v41": best.get("v41"), "v3": best.get("v3")}
    rec.meta["configs"] = {**configs, **{k: v for k, v in best.items() if k not in configs}}
    gen = torch.Generator().manual_seed(0)
    for M in args.m:
        for name, (N, K) in DENSE_SHAPES.items():
            bench_dense(rec, M, name, N, K, configs)
            torch.cuda.empty_cache()
    for G_ in (96, 192):
        for name, (N, K) in MOE_SHAPES.items():
            bench_contiguous(rec, G_, name, N, K, best.get("fp4_contiguous"), gen)
            torch.cuda.empty_cache()
    copy_gbs = copy_bandwidth_gbs()
    torch.cuda.empty_cache()
    for expected_m in (8, 32):
        for name, (N, K) in MOE_SHAPES.items():
            bench_masked(rec, 96, expected_m, name, N, K, None, copy_gbs)  # tile height from expected_m
    table = summary(rec)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
