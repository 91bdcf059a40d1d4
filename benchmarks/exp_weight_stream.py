"""Experiment (issue 4): does the masked MoE GEMM's weight access pattern cap its bandwidth?

The masked FP8 x FP4 GEMM (MoE decode) streams every expert's packed weights once and reads them at 0.39 of a
device copy at 8 rows per expert, 0.30 at 32 (session 13 run 7; target 0.6). Each program owns 128 weight rows and
walks K in steps of 64 values: per step it reads 32 bytes of each of its 128 rows, and the rows lie K / 2 bytes
apart (2,560 B for w13). So each request is 128 scattered 32-byte pieces, and a row's next 32 bytes come one step
later. This times that read pattern alone, without conversion or MMAs, against two others over the same bytes:
- `rows32`: the kernels' pattern: [128 rows, 32 B] per step from the row-major [G, N, K / 2] weights;
- `rows128`: [128 rows, 128 B] per step (four of today's steps at once) from the same layout;
- `blocked32`: [128 rows, 32 B] per step from a step-blocked copy [G, N / 128, K / 64, 128, 32], where each step of a
  128-row tile is one contiguous 4 KB block (a layout the weights could be stored in at load time).
Then the same question inside the kernel (`kernel_rows`): the masked Gluon GEMM as routed, against a variant that
reads the step-blocked copy (two source edits: a tile's rows 32 B apart, a step 4 KB further), at 8 and 32 rows per
expert on `bench_deepgemm.py`'s masked case, bitwise-checked (same values, same products).
One program per 128-row tile (96 experts x N / 128, as the masked kernel at 8 rows per expert), `tl.range`
pipelining at 3 and 6 stages. Each program XORs its bytes into one word. XOR does not depend on order, so the three
patterns must give the same words: that checks the blocked copy and the indexing. Device copy (read + write, by
do_bench) and a plain 1-D read kernel are the peers. Writes $OUT/exp_weight_stream.json.

    cd benchmarks && timeout 120 python3 exp_weight_stream.py
    TRITON_INTERPRET=1 python3 exp_weight_stream.py --check   # CPU: the three patterns agree on a small case
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import triton
import triton.language as tl
from source_variants import absolute_imports, edited_module  # beside this script

SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}
EXPERTS = 96


@triton.jit
def stream_tiles_kernel(w_ptr, out_ptr, steps, tiles_per_group, stride_group, stride_tile, stride_row, stride_step,
                        BYTES: tl.constexpr, STAGES: tl.constexpr):
    """Program p reads tile p % tiles_per_group of group p // tiles_per_group: `steps` reads of [128 rows, BYTES]
    at w + group * stride_group + tile * stride_tile + row * stride_row + step * stride_step + byte; stores the XOR
    of all of them as one int32."""
    p = tl.program_id(0)
    base = w_ptr + (p // tiles_per_group).to(tl.int64) * stride_group + (p % tiles_per_group).to(tl.int64) * stride_tile
    offs = tl.arange(0, 128)[:, None].to(tl.int64) * stride_row + tl.arange(0, BYTES // 4)[None, :] * 4
    acc = tl.zeros([128, BYTES // 4], dtype=tl.int32)
    for i in tl.range(0, steps, num_stages=STAGES):
        acc ^= tl.load((base + i * stride_step + offs).to(tl.pointer_type(tl.int32)))
    tl.store(out_ptr + p, tl.reduce(tl.reshape(acc, [128 * BYTES // 4]), 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def stream_flat_kernel(w_ptr, out_ptr, n_words, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """The plain peer: program p XORs int32 words [p * n_words, (p + 1) * n_words) in BLOCK-word chunks."""
    p = tl.program_id(0)
    base = w_ptr.to(tl.pointer_type(tl.int32)) + p.to(tl.int64) * n_words
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.range(0, n_words, BLOCK, num_stages=STAGES):
        acc ^= tl.load(base + i + tl.arange(0, BLOCK))
    tl.store(out_ptr + p, tl.reduce(acc, 0, _xor))


def step_blocked(w: torch.Tensor) -> torch.Tensor:
    """[G, N, K / 2] -> [G, N / 128, K / 64, 128, 32]: each 64-value step of a 128-row tile contiguous."""
    G, N, K2 = w.shape
    return w.view(G, N // 128, 128, K2 // 32, 32).permute(0, 1, 3, 2, 4).contiguous()


def launch(pattern: str, w: torch.Tensor, wb: torch.Tensor, out: torch.Tensor, stages: int) -> None:
    G, N, K2 = w.shape
    tiles = N // 128
    if pattern == "blocked32":
        args = (wb, out, K2 // 32, tiles, wb.stride(0), wb.stride(1), 32, 4096)
        bytes_per_step = 32
    else:
        bytes_per_step = 32 if pattern == "rows32" else 128
        args = (w, out, K2 // bytes_per_step, tiles, w.stride(0), 128 * K2, K2, bytes_per_step)
    stream_tiles_kernel[(G * tiles,)](*args, BYTES=bytes_per_step, STAGES=stages, num_warps=4)


def xor_rows(x: torch.Tensor) -> torch.Tensor:
    """XOR of each row of an int32 matrix whose row length is a power of two."""
    while x.shape[1] > 1:
        x = x[:, 0::2] ^ x[:, 1::2]
    return x[:, 0]


def check() -> None:
    """Small case (CPU interpreter or GPU): the three patterns give the same XOR per tile."""
    dev = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, device=dev, generator=g)  # N 256, K 512
    wb = step_blocked(w)
    words = {}
    for pattern in ("rows32", "rows128", "blocked32"):
        out = torch.zeros(3 * 2, dtype=torch.int32, device=dev)
        launch(pattern, w, wb, out, 2)
        words[pattern] = out
    want = xor_rows(w.cpu().view(torch.int32).reshape(3 * 2, -1))  # tile t of group g: rows 128 t .. 128 t + 127
    for pattern, got in words.items():
        assert torch.equal(got.cpu(), want), pattern
    print("check: rows32, rows128 and blocked32 agree with the host XOR per tile")


def measure(name: str, N: int, K: int, copy_gbs: float) -> dict:
    """GB/s of each pattern and the plain read over one shape's weights (96 experts)."""
    from exp_gemm_gluon_v3 import ms

    w = torch.randint(0, 256, (EXPERTS, N, K // 2), dtype=torch.uint8, device="cuda")
    wb = step_blocked(w)
    out = torch.empty(EXPERTS * (N // 128), dtype=torch.int32, device="cuda")
    row = dict(name=name, N=N, K=K, experts=EXPERTS, bytes=w.numel(), copy_gbs=copy_gbs)
    reference = None
    for pattern in ("rows32", "rows128", "blocked32"):
        for stages in (3, 6):
            launch(pattern, w, wb, out, stages)
            reference = out.clone() if reference is None else reference
            row[f"{pattern}_s{stages}_same_words"] = bool(torch.equal(out, reference))
            row[f"{pattern}_s{stages}_gbs"] = w.numel() / ms(lambda: launch(pattern, w, wb, out, stages)) / 1e6
    n_words = w.numel() // 4 // out.numel()
    for stages in (3, 6):
        row[f"flat_s{stages}_gbs"] = w.numel() / ms(lambda: stream_flat_kernel[(out.numel(),)](
            w, out, n_words, BLOCK=1024, STAGES=stages, num_warps=4)) / 1e6
    return row


# The masked Gluon kernel reading step-blocked weights (BLOCK_N = 128 rows per tile, N % 128 == 0): the tile starts
# where the row-major tile does (off_n x K / 2 bytes into the group), its rows lie 32 B apart, its steps 4 KB apart.
BLOCKED_WEIGHTS = [
    absolute_imports("mini_deepgemm"),
    ("w_ptrs = w_base + (n_w % N).to(gl.int64)[:, None] * stride_w_n + gl.arange(0, 32, gl.SliceLayout(0, w_copy))"
     "[None, :]",
     "w_ptrs = w_base + off_n.to(gl.int64) * stride_w_n + (n_w - off_n).to(gl.int64)[:, None] * 32 "
     "+ gl.arange(0, 32, gl.SliceLayout(0, w_copy))[None, :]"),
    ("async_copy.async_copy_global_to_shared(w_ring.index(slot), w_ptrs + 32 * step)",
     "async_copy.async_copy_global_to_shared(w_ring.index(slot), w_ptrs + w_ring.type.shape[1] * 32 * step)"),
]


def kernel_rows(copy_gbs: float) -> list[dict]:
    """The routed masked GEMM (activation pass excluded, same x) against the step-blocked variant."""
    import mini_deepgemm.gemm_gluon_kernel as kernel_module
    from exp_gemm_gluon_v3 import ms
    from exp_gemm_masked_tiles import masked_operands
    from mini_deepgemm import gemm as G

    shipped = kernel_module.fp4_grouped_gemm_kernel
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        blocked = edited_module(kernel_module, BLOCKED_WEIGHTS, "masked_blocked_weights", workdir)
        for expected_m in (8, 32):
            for name, (N, K) in SHAPES.items():
                Gn, max_m = EXPERTS, 128
                masked_m, a, sa, bq, sb = masked_operands(Gn, max_m, N, K, expected_m, gen, cpu)
                bq_blocked = step_blocked(bq).view(Gn, N, K // 2)  # same strides as bq, bytes permuted
                x = G._dequant_masked_rows(a, sa, masked_m)
                cfg = G.default_config(G._MASKED, expected_m, 32, True, N, Gn, True)
                used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
                outs, times = {}, {}
                for variant, kernel, w in (("routed", shipped, bq), ("blocked", blocked.fp4_grouped_gemm_kernel,
                                                                     bq_blocked)):
                    kernel_module.fp4_grouped_gemm_kernel = kernel  # _gluon_fp4_grouped_gemm imports it per call
                    try:
                        d = torch.zeros(Gn, max_m, N, dtype=torch.bfloat16, device="cuda")
                        G._gluon_fp4_grouped_gemm(G._MASKED, x, w, sb, d, masked_m, cfg)
                        outs[variant] = d
                        times[variant] = ms(lambda: G._gluon_fp4_grouped_gemm(G._MASKED, x, w, sb, d, masked_m,
                                                                              cfg))
                    finally:
                        kernel_module.fp4_grouped_gemm_kernel = shipped
                weight_bytes = bq.numel() + sb.numel()
                row = dict(name=name, expected_m=expected_m, block_m=cfg["BLOCK_M"], copy_gbs=copy_gbs,
                           bitwise=bool(torch.equal(outs["routed"][used], outs["blocked"][used])),
                           **{f"{v}_gbs": weight_bytes / t / 1e6 for v, t in times.items()})
                rows.append(row)
                print(row, flush=True)
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    from bench_deepgemm import copy_bandwidth_gbs  # beside this script

    check()
    copy_gbs = copy_bandwidth_gbs()
    rows_out = []
    for name, (N, K) in SHAPES.items():
        rows_out.append(measure(name, N, K, copy_gbs))
        print(rows_out[-1], flush=True)
        torch.cuda.empty_cache()
    kernel = kernel_rows(copy_gbs)
    with open(os.path.join(os.environ.get("OUT", "."), "exp_weight_stream.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       timing="do_bench_cudagraph median; copy by do_bench", rows=rows_out, kernel=kernel), f,
                  indent=1)
    keys = [k[:-4] for k in rows_out[0] if k.endswith("_gbs") and k != "copy_gbs"]
    print("| shape | " + " | ".join(keys) + " | copy |")
    for r in rows_out:
        print(f"| {r['name']} | " + " | ".join(f"{r[k + '_gbs']:.0f} ({r[k + '_gbs'] / r['copy_gbs']:.2f})"
                                             for k in keys) + f" | {r['copy_gbs']:.0f} |")
    print("| masked GEMM | rows per expert | routed GB/s | step-blocked weights GB/s | bitwise |")
    for r in kernel:
        print(f"| {r['name']} | {r['expected_m']} | {r['routed_gbs']:.0f} ({r['routed_gbs'] / r['copy_gbs']:.2f}) | "
              f"{r['blocked_gbs']:.0f} ({r['blocked_gbs'] / r['copy_gbs']:.2f}) | {r['bitwise']} |")


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()

