"""Session 78 experiment: the Triton route's dense V3 GEMM on TMA loads, warp-specialized by triton's Hopper pass.

Why: on the Triton route (a uv-locked install, MINI_DEEPGEMM_GLUON=0, any GPU but Hopper under triton 3.6) the dense
V3-recipe GEMM, which also runs every folded V4.1 projection of the engine's prefill, is gemm_kernel's 64 x 128 tile
at 0.56x cuBLAS per-tensor FP8 against the Gluon kernel's 0.86x (H200, session 72: docs/reports/triton-route-on-
hopper.md). The Gluon kernel's lead is its TMA producer warp beside the math warpgroups. Triton 3.6 and 3.9 carry a
Hopper pass for that (`tl.range(..., warp_specialize=True)`; its docstring says Blackwell only, but `make_ttgir` runs
`add_hopper_warpspec` for sm_90): offline it turns a loop of TMA tensor-descriptor loads and dots into a producer
warpgroup (setmaxnreg 40) and consumer warpgroups (232), 12 warps from 4. It asserts on pointer loads feeding the dot,
on a register-converted operand (the MoE kernel, the attention's gathers) and on an early return; a dense FP8 loop
whose operands come by TMA and whose scales come by pointer loads passes.

What it runs: `fp8_gemm_v3_ws_kernel` below, the same arithmetic as gemm_kernel.scaled_gemm_nt_kernel at BLOCK_K = 128
(one FP8 dot per 128 of K into a fresh tile, promoted by sa[m] * sb[n // 128]) with A and B through host tensor
descriptors and the loop warp-specialized or not, at the tiles in CONFIGS. It checks each variant bitwise against
gemm_kernel's 64 x 128 launch (the Triton route's tile) and times (CUDA-graph replay) that launch, each variant and
cuBLAS per-tensor FP8 at bench_deepgemm's dense shapes and operands, M = 4,096 (env M for another). (Run 4 also
timed the API as then routed: the route to this kernel, reverted since.) Offline
(`--compile`, no GPU): each variant's warps after the pass, registers, spills and shared memory for sm_90.

Found (H100, runs 2-4 of gpu-session-2026-12-07-s78.md): every 128-row tile (two consumer warpgroups) hangs at its
first launch under triton 3.6 (exp_ws_hang.py; under 3.9 the pass rejects them offline); 64-row tiles finish, bitwise
equal to gemm_kernel, at 0.31x cuBLAS where gemm_kernel runs 0.52x. Not shipped.

Usage: MINI_DEEPGEMM_GLUON=0 python3 exp_gemm_v3_triton_ws.py   (GPU, from benchmarks/)
       PYTHONPATH=integration_tests:... python3 benchmarks/exp_gemm_v3_triton_ws.py --compile
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

from mini_deepgemm.gemm_kernel import grouped_tile

# (BLOCK_M, BLOCK_N, num_warps before the pass, num_stages, warp-specialized)
# (run 4; run 2 had (128, 128, 8, 4, False), (128, 128, 4, 4 / 3, True), (128, 256, 4, 3, True) and hung at them)
CONFIGS = [(64, 128, 4, 4, False), (64, 128, 4, 4, True), (64, 128, 4, 3, True), (64, 128, 4, 6, True)]
# gemm_kernel's launch on the Triton route's dense V3 tile (gemm.default_config); an explicit config keeps the API on
# gemm_kernel on either route
GEMM_KERNEL_V3 = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4, BF16_MMA=False)


@triton.jit
def fp8_gemm_v3_ws_kernel(a_desc, sa_ptr, b_desc, sb_ptr, d_ptr, M, N, K, stride_sa_m, stride_sb_n, stride_d_m,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr,
                          WARP_SPECIALIZE: tl.constexpr):
    """d[M, N] = (a * sa) @ (b * sb)^T. a: e4m3 [M, K] and b: e4m3 [N, K] as tensor descriptors of [BLOCK_M, 128] and
    [BLOCK_N, 128] boxes; sa fp32 [M, K / 128] and sb fp32 [cdiv(N, 128), K / 128], unit stride along K; d bf16."""
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
    out = d_ptr + offs_m.to(tl.int64)[:, None] * stride_d_m + offs_n[None, :]
    tl.store(out, acc.to(tl.bfloat16), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def gemm_kernel_v3(a, sa, b, sb, d):
    """The same GEMM on gemm_kernel.scaled_gemm_nt_kernel (GEMM_KERNEL_V3), the bits the variants must keep."""
    from mini_deepgemm import gemm as G

    G._gemm(G._DENSE, (a, sa), (b, sb), d, None, None, G.V3_RECIPE, False, config=GEMM_KERNEL_V3)


def launch(cfg, a, sa, b, sb, d):
    from triton.tools.tensor_descriptor import TensorDescriptor

    block_m, block_n, num_warps, stages, ws = cfg
    M, K = a.shape
    N = b.shape[0]
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    return fp8_gemm_v3_ws_kernel[grid](
        TensorDescriptor.from_tensor(a, [block_m, 128]), sa, TensorDescriptor.from_tensor(b, [block_n, 128]), sb, d,
        M, N, K, sa.stride(0), sb.stride(0), d.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, STAGES=stages, WARP_SPECIALIZE=ws, num_warps=num_warps,
        enable_fp_fusion=True)


def compile_only() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, "integration_tests")
    from sm90_compile import _resources

    for cfg in CONFIGS:
        block_m, block_n, num_warps, stages, ws = cfg
        sig = {"a_desc": f"tensordesc<fp8e4nv[{block_m}, 128]>", "sa_ptr": "*fp32",
               "b_desc": f"tensordesc<fp8e4nv[{block_n}, 128]>", "sb_ptr": "*fp32", "d_ptr": "*bf16",
               "M": "i32", "N": "i32", "K": "i32", "stride_sa_m": "i32", "stride_sb_n": "i32", "stride_d_m": "i32",
               **{k: "constexpr" for k in ("BLOCK_M", "BLOCK_N", "GROUP_M", "STAGES", "WARP_SPECIALIZE")}}
        src = ASTSource(fp8_gemm_v3_ws_kernel, signature=sig, constexprs=dict(
            BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=8, STAGES=stages, WARP_SPECIALIZE=ws))
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": num_warps, "enable_fp_fusion": True})
        except Exception as e:  # noqa: BLE001 - a config the pass rejects is a result of the experiment
            print(f"{cfg}: compile failed: {str(e).splitlines()[0][:120]}")
            continue
        regs, local = _resources(k.asm["cubin"], "fp8_gemm_v3_ws_kernel")
        print(f"{cfg}: warps {k.metadata.num_warps} regs {regs} local {local} B smem {k.metadata.shared} B, "
              f"partitioned {'ttg.warp_specialize' in k.asm['ttgir']}")


def main() -> None:
    from bench_deepgemm import DENSE_SHAPES, dense_operands
    from triton.testing import do_bench_cudagraph

    M = int(os.environ.get("M", "4096"))
    one = torch.ones((), device="cuda")
    names = " | ".join(f"{bm}x{bn} w{w} s{s}{' ws' if ws else ''}" for bm, bn, w, s, ws in CONFIGS)
    print(f"M = {M}; TFLOP/s (ratio to cuBLAS per-tensor FP8); 'x' = bits differ from gemm_kernel's 64 x 128 launch")
    print(f"| shape | cuBLAS per-tensor | gemm_kernel 64x128 | {names} |")
    print("|---|---:|---:|" + "---:|" * len(CONFIGS))
    columns = ["gemm_kernel", *CONFIGS]
    ratios = {c: [] for c in columns}
    for name, (N, K) in DENSE_SHAPES.items():
        op = dense_operands(M, N, K)
        (a, sa), (b, sb) = op["v3"]
        ref = op["d"]
        calls = {"gemm_kernel": lambda d: gemm_kernel_v3(a, sa, b, sb, d)}
        calls.update({cfg: lambda d, cfg=cfg: launch(cfg, a, sa, b, sb, d) for cfg in CONFIGS})
        calls["gemm_kernel"](ref)
        flops = 2 * M * N * K
        t_cublas = do_bench_cudagraph(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16))
        cells = [f"{flops / t_cublas / 1e9:.0f}"]
        for col in columns:
            d = torch.empty_like(ref)
            try:
                calls[col](d)
                same = torch.equal(d, ref)
                t = do_bench_cudagraph(lambda: calls[col](d))
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result of the experiment
                cells.append(f"failed: {str(e).splitlines()[0][:60]}")
                continue
            ratios[col].append(t_cublas / t)
            cells.append(f"{flops / t / 1e9:.0f} ({t_cublas / t:.3f}){'' if same else ' x'}")
        print(f"| {name} {M}x{N}x{K} | " + " | ".join(cells) + " |", flush=True)
    geo = {c: (torch.tensor(r).log().mean().exp().item() if r else float("nan")) for c, r in ratios.items()}
    print("| geomean ratio | 1 | " + " | ".join(f"{geo[c]:.3f}" for c in columns) + " |")


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
