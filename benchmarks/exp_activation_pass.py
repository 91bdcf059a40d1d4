"""Experiment (issue 4): the grouped FP4 GEMMs' activation pass (gemm._dequant_activations, e4m3 x UE8M0 -> bf16 in
the FP4 K order), session 17's version against session 16's, same run, bitwise.

Why (docs/reports/deepgemm-activation-pass.md; session 17 run 1 profile): in the masked decode call (96 experts,
128 rows each, ~8 used) the pass took 53 us next to the GEMM's 595, and five small torch kernels built its row map
(~13 us): every 8-row program computed addresses for rows it never touched (23 instructions per element, IMAD and
LOP3). In the contiguous prefill call the pass took 450 us next to the GEMM's 4.3 ms at 94% of L1 throughput: its
byte gathers (even, then odd columns) read each 32-byte sector for 4 useful bytes.
Session 17 (shipped): programs whose rows are all unused return at once, the masked counts are read in the kernel (no
row map), and the FP4 order is read as contiguous 2-byte pairs whose two values go to their two halves of the
64-block. "before" below is session 16's kernel and masked row map, rebuilt from their text.

Cases: the masked layout (96 groups x 128 rows, Poisson(8) and Poisson(32) used rows, at least 1, K 5,120 and 2,304:
bench_deepgemm's masked rows) and the contiguous layout (bench_deepgemm's: 96 experts of 128-1,024 rows; and one
as 1-GPU prefill routes: 4,096 tokens x 6 of 256 experts, segments 128-aligned, a quarter padding). Device time by
CUDA-graph replay. Writes $OUT/exp_activation_pass.json.

    cd benchmarks && timeout 200 python3 exp_activation_pass.py
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import torch
import triton

from bench_deepgemm import moe_layout, rand_fp8, rand_ue8m0  # beside this script
from bench_flashmla import environment
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm import gemm_swapab_kernel as kernel_module
from mini_deepgemm.testing import contiguous_layout
from source_variants import absolute_imports, edited_module

SESSION16_KERNEL = '''def dequant_act_kernel(q_ptr, s_ptr, out_ptr, group_ptr, M, K, stride_q, stride_s, stride_out,
                       PERMUTE_FP4: tl.constexpr, SKIP_PADDING: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    if PERMUTE_FP4:
        j = offs_k % 64
        src = offs_k - j + tl.where(j < 32, 2 * j, 2 * (j - 32) + 1)
    else:
        src = offs_k
    row_ok = offs_m < M
    if SKIP_PADDING:
        row_ok = row_ok & (tl.load(group_ptr + offs_m, mask=row_ok, other=-1) >= 0)
    mask = row_ok[:, None] & (offs_k < K)[None, :]
    rows = offs_m.to(tl.int64)[:, None]
    q = tl.load(q_ptr + rows * stride_q + src[None, :], mask=mask, other=0.0)
    e = tl.load(s_ptr + rows * stride_s + (src // 32)[None, :], mask=mask, other=127).to(tl.int32)
    tl.store(out_ptr + rows * stride_out + offs_k[None, :], fp8_to_bf16_scaled(q, e), mask=mask)


'''


def session16_module(workdir: str):
    edit = (re.compile(r"^def dequant_act_kernel\(.*?(?=^@triton\.jit\ndef block_scales)", re.M | re.S),
            SESSION16_KERNEL)
    return edited_module(kernel_module, [absolute_imports("mini_deepgemm"), edit], "dequant_act_s16", workdir)


def session16_pass(module, aq, sa, layout):
    M, K = aq.shape
    x = torch.empty(M, K, dtype=torch.bfloat16, device=aq.device)
    module.dequant_act_kernel[(triton.cdiv(M, 8), triton.cdiv(K, 512))](
        aq, sa, x, layout, M, K, aq.stride(0), sa.stride(0), x.stride(0), PERMUTE_FP4=True, SKIP_PADDING=True,
        BLOCK_M=8, BLOCK_K=512, num_warps=4)
    return x


def session16_masked(module, aq, sa, masked_m):
    """Session 16's _dequant_masked_rows: the row map by torch ops, then the pass."""
    Gr, max_m, K = aq.shape
    used = torch.arange(max_m, device=aq.device)[None, :] < masked_m[:, None]
    ids = torch.where(used, torch.arange(Gr, device=aq.device, dtype=torch.int32)[:, None], -1).flatten()
    return session16_pass(module, aq.reshape(Gr * max_m, K), sa.reshape(Gr * max_m, -1), ids).view(Gr, max_m, K)


def prefill_layout(gen) -> torch.Tensor:
    """4,096 tokens routed to 6 of 256 experts at random, segments aligned to the GEMM's 128 rows."""
    counts = torch.bincount(torch.randint(0, 256, (4096 * 6,), generator=gen), minlength=256).tolist()
    return contiguous_layout(counts, G.get_m_alignment_for_contiguous_layout()).cuda()


def compare(row: dict, before, after, written: torch.Tensor, bytes_moved: int) -> dict:
    want, got = before(), after()
    row["bitwise_on_written_rows"] = bool(torch.equal(got[written].view(torch.int16), want[written].view(torch.int16)))
    row["before_us"], row["after_us"] = ms(before) * 1e3, ms(after) * 1e3
    row["speedup"] = row["before_us"] / row["after_us"]
    row["after_gbs"] = bytes_moved / row["after_us"] / 1e3  # e4m3 read + bf16 written, used rows only
    print(row, flush=True)
    return row


def main() -> None:
    result, rows = environment(torch.device("cuda")), []
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as workdir:
        old = session16_module(workdir)
        for expected_m in (8, 32):
            for K in (5120, 2304):
                masked = torch.clamp(torch.poisson(torch.full((96,), float(expected_m)), generator=gen), 1, 128).int()
                a, sa = rand_fp8(96, 128, K), rand_ue8m0(96, 128, K // 32).view(torch.uint8)
                masked_m = masked.cuda()
                written = (torch.arange(128)[None, :] < masked[:, None]).cuda()
                rows.append(compare(dict(case="masked", expected_m=expected_m, K=K, used_rows=int(masked.sum())),
                        lambda: session16_masked(old, a, sa, masked_m), lambda: G._dequant_masked_rows(a, sa, masked_m),
                        written, int(masked.sum()) * K * 3))
        for name, layout in (("bench_96", moe_layout(96, gen)[1]), ("prefill_6_of_256", prefill_layout(gen))):
            for K in (5120, 2304):
                M = layout.numel()
                a, sa = rand_fp8(M, K), rand_ue8m0(M, K // 32).view(torch.uint8)
                written = layout >= 0
                rows.append(compare(dict(case="contiguous", layout=name, K=K, rows=M, used_rows=int(written.sum())),
                        lambda: session16_pass(old, a, sa, layout),
                        lambda: G._dequant_activations(a, sa, True, grouped_layout=layout),
                        written, int(written.sum()) * K * 3))
    result["rows"] = rows
    with open(os.path.join(os.environ.get("OUT", "."), "exp_activation_pass.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
