"""Experiment (issue 4; written in session 24, measured in sessions 25 and 26): the masked FP8 x FP4 MoE kernel with
the converted weights as the wgmma's register A operand, on weights permuted per K step (permute_k_steps).
Session 25 run 1 (H200): 1.03-1.26x the then-shipped kernel (a converted tile in shared memory), bitwise equal.
Session 26 run 1: mini_deepgemm ships the register A operand on the engine's (natural) byte order
(_masked_folded_steps, each word's two 16-bit pieces gathered from shared memory by _fragment_words), which this
permuted order beats by 1.02-1.05x, bitwise equal (docs/reports/deepgemm-moe-fold-128.md, "Session 26"). Kept as
the measured design for the step that remains: the contiguous kernel reading the permuted order too, so that both
could take it. The text below is session 24's design note.

Why (docs/reports/deepgemm-moe-fold-128.md, session 24): at ~32 rows per expert the shipped masked kernel reaches
0.37-0.41 of the copy rate against the issue's 0.6. Two converted tiles, 8 warps per CTA and deeper rings all
measured slower or equal, which points at each CTA's serial step: wait for the ring slot, convert the packed weights
into a shared e4m3 tile (16 KB of stores), fence, CTA barrier, MMA from shared memory, wait, promote. The rate is set
by how many of those chains overlap on an SM, not by the copies in flight.

How: the conversion goes straight into the MMA's A registers, so no shared tile, fence or CTA barrier sits between
the conversion and the MMA, and the first half's MMA runs while the second half converts.
- A thread's A fragment of a k32 chunk c is rows g and g + 8 (g = lane / 4 + 16 x warp) and values 32c + 4q .. + 3
  and 32c + 16 + 4q .. + 3 (q = lane % 4): bytes 16c + {2q, 2q + 1, 8 + 2q, 9 + 2q} of the row's K step. So the
  experiment permutes every weight row's 64 bytes per K step at load (`permute_k_steps`): byte 16q + 4c + j takes
  old byte 16c + (2q, 2q + 1, 8 + 2q, 9 + 2q)[j]. A thread's 16 bytes of a row are then contiguous (one 16-byte
  shared load per row, as the shipped kernel), and each 32-bit word (4q + c) holds chunk c's 8 values of the
  thread: the shipped 8-value conversion (`_E2M1_TO_E4M3_PTX`, table of the word's 32-block) turns it into the
  fragment's two registers, values 0-3 and 4-7.
- `_half_operand` turns the converted words into the e4m3 [64, 128] operand: join, reshape and permute to the
  operand's order (k / 4 = 8c + 4s + q), each word repeated for its 4 values, and an identity asm with pack=4; the
  layout conversion to the operand layout is checked trivial at compile time. Offline (probe, session 24): 4
  QGMMA.64xNx32 with a register A per half, no extra byte permutes.
- The ring (TMA, 2 stages, a 64-byte swizzle), the grid (token tiles fastest), the folded activations and the
  promotion are the shipped kernel's. Without a CTA barrier the ring stays safe: a slot is refilled after the step
  that read it waited for its MMAs, and an MMA with register A operands starts only once all four warps have issued
  it, that is, after every warp's loads of the slot.
- Offline (triton 3.6, sm_90a; 16 / 32 / 64 tokens): 115 / 128 / 228 registers (128 forced at 16 and 32 tokens:
  4 CTAs per SM, as shipped, no spill), 20 / 25 / 33 KB of shared memory (the shipped kernel's 16 KB tile is gone),
  679 SASS instructions at 32 tokens against the shipped kernel's 752. The loop keeps the CTA barriers Gluon puts
  around the single-thread TMA issue and mbarrier wait (all four warps meet there once per step); a producer warp
  (warp specialization) would take those out too, at the cost of its registers.
- The outputs should be bitwise the shipped kernel's (the same e4m3 products, the same four k32 MMAs per step in the
  same order, the same FMAs); the run compares every used row.
- Shipping it would need the permuted byte order in the engine's FP4 expert weights, which the contiguous (prefill)
  kernel reads too: it would have to store its converted words at the permuted positions.

Measures (96 experts, Poisson(8 / 32 / 64) rows, w13 and w2, folded weights and activations, the shipped token tile
for each load): weight bytes per second as a fraction of the device copy for the shipped kernel and this one, by
CUDA-graph replay, and the bitwise comparison. Writes $OUT/exp_moe_masked_rega.json.

    cd benchmarks && python3 exp_moe_masked_rega.py
"""

from __future__ import annotations

import json
import os

import torch
from bench_deepgemm import FP4_SCALE_BOUND, copy_bandwidth_gbs, masked_operands, rand_fp4_weight_scales  # beside this
from bench_flashmla import environment
from bench_fp4_e4m3_route import MOE_SHAPES
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import (_HALF_WORDS, _masked_fill, _masked_folded_steps, _masked_ring,
                                                      _masked_store, _raw_words)
from mini_deepgemm.reference import fold_ue8m0_to_128
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

def permute_k_steps(bq: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 weights [..., K / 2] with each 64-byte K step's bytes in the register-A order (module docstring)."""
    src = torch.tensor([16 * c + (2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q)[j]
                        for q in range(4) for c in range(4) for j in range(4)], device=bq.device)
    steps = bq.view(*bq.shape[:-1], -1, 64)
    return steps[..., src].reshape(bq.shape).contiguous()


@gluon.jit
def _permuted_words(w_ring, slot, half: gl.constexpr):
    """Half `half` of ring slot `slot`'s weights in permute_k_steps's order -> each thread's A-fragment words (int32
    [64, 16] in _HALF_WORDS): one 16-byte shared load per row, where the shipped _fragment_words gathers 16-bit
    pieces of the natural order."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    return _raw_words(w_ring, STAGES).index(slot).slice(64 * half, 64, dim=0).load(_HALF_WORDS)


@gluon.jit
def masked_rega_kernel(w_desc, x_desc, d_ptr, offsets_ptr, sa_ptr, colscale_ptr, masked_m_ptr, max_m, N, K, stride_sa,
                       stride_d_g, stride_d_m, STAGES: gl.constexpr):
    """fp4_e4m3_masked_kernel's contract with SA_PER_128 (activations folded per 128) and its K loop
    (_masked_folded_steps), on weights in permute_k_steps's order (_permuted_words). Grid (cdiv(max_m, BLOCK_M),
    N / 128, G); num_warps=4."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 32])
    w_ring, x_ring, ready = _masked_ring(w_desc, x_desc, STAGES)
    m0 = gl.program_id(0) * BLOCK_M
    n0 = gl.program_id(1) * 128
    g = gl.program_id(2)
    rows_used = gl.load(masked_m_ptr + g)
    if m0 < rows_used:
        num_k = K // 128
        w_row = g * N + n0
        x_row = g * max_m + m0
        _masked_fill(w_desc, x_desc, w_ring, x_ring, ready, num_k, w_row, x_row)
        acc_lo, acc_hi = _masked_folded_steps(w_ring, x_ring, ready, w_desc, x_desc, offsets_ptr, sa_ptr, num_k, w_row,
                                              x_row, m0, max_m, K, stride_sa, mma, _permuted_words)
        tokens = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        _masked_store(acc_lo, acc_hi, d_ptr, colscale_ptr, g, n0, w_row, tokens, rows_used, stride_d_g, stride_d_m)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))


def launch(a128: tuple[torch.Tensor, torch.Tensor], bq: torch.Tensor, folded: G.FoldedFP4Scales,
           d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """The shipped masked launch (gemm._fp4_e4m3_gemm) on masked_rega_kernel; bq in permute_k_steps's order."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (aq, sa), (groups, n, k2) = a128, bq.shape
    max_m, k = aq.shape[1], aq.shape[2]
    block_m, stages = G._masked_tile(expected_m)
    w_desc = TensorDescriptor.from_tensor(bq.view(groups * n, k2), [128, 64], G._packed_fp4_layout())
    masked_rega_kernel[(-(-max_m // block_m), n // 128, groups)](
        w_desc, G._tma_desc(aq.view(groups * max_m, k), (block_m, 128)), d, folded.offsets, sa,
        folded.column_scales, masked_m, max_m, n, k, k // 128, d.stride(0), d.stride(1), STAGES=stages, num_warps=4,
        **({"maxnreg": 128} if block_m <= 32 else {}))  # 4 CTAs per SM; 64 tokens take 228 (2 CTAs), no spill


KERNELS = ("shipped", "register_a_permuted")


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    result = {"environment": environment(torch.device("cuda")), "copy_gbs": copy_gbs, "rows": []}
    for expected_m in (8, 32, 64):
        for name, N, K in MOE_SHAPES:
            masked, masked_m, (a, sa), (bq, _), d = masked_operands(96, expected_m, N, K, gen)
            sb = rand_fp4_weight_scales(96, N, K // 32, low=118)
            folded, a128 = G.fold_fp4_weight_scales(sb), fold_ue8m0_to_128(a, sa, 1)
            bq_permuted = permute_k_steps(bq)
            used = torch.arange(a.shape[1], device="cuda")[None, :] < masked_m[:, None]
            outs = {kernel: torch.empty_like(d) for kernel in KERNELS}
            calls = {
                "shipped": lambda: G.m_grouped_fp8_fp4_gemm_nt_masked(a128, (bq, sb), outs["shipped"], masked_m,
                                                                      expected_m, weight_scale_max=FP4_SCALE_BOUND,
                                                                      folded=folded),
                "register_a_permuted": lambda: launch(a128, bq_permuted, folded, outs["register_a_permuted"],
                                                      masked_m, expected_m),
            }
            row = {"expected_m": expected_m, "name": name, "rows": int(masked.sum()),
                   "tile": G._masked_tile(expected_m)}
            for kernel, call in calls.items():
                call()
                t = ms(call)
                row[f"us_{kernel}"] = t * 1e3
                row[f"frac_of_copy_{kernel}"] = (bq.numel() + sb.numel()) / t / 1e6 / copy_gbs
            shipped = outs["shipped"][used]
            for kernel in KERNELS[1:]:
                ours = outs[kernel][used]
                row[f"bitwise_{kernel}"] = bool(torch.equal(ours.view(torch.int16), shipped.view(torch.int16)))
                row[f"max_abs_diff_{kernel}"] = (ours.float() - shipped.float()).abs().max().item()
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "exp_moe_masked_rega.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| rows per expert | GEMM | tile | shipped (natural order) | permuted order | ratio | bitwise |")
    for r in result["rows"]:
        print(f"| ~{r['expected_m']} | {r['name']} | {r['tile'][0]} | {r['frac_of_copy_shipped']:.3f} | "
              f"{r['frac_of_copy_register_a_permuted']:.3f} | {r['us_shipped'] / r['us_register_a_permuted']:.2f}x | "
              f"{r['bitwise_register_a_permuted']} |")


if __name__ == "__main__":
    main()
