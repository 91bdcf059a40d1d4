"""Experiment (session 33): how fast the H200 issues the integer and bf16 instructions of the kernels' FP4 decodes.
Session 33 replaced the e2m1 -> bf16 decode's and-mul-and (LOP3, IMAD, HMUL2) with byte-permute table lookups (PRMT):
the per-query indexer's loop went from 782 to 739 SASS instructions per key tile and ran 0.91-0.94x as fast
(docs/reports/flashmla-fp4-table-decode.md). Run 4 measured the single instructions: PRMT issues as fast as LOP3,
SHF and IMAD (0.71-0.73 of FFMA's rate), so PRMT's rate was not the cause; Nsight Compute put the difference on the
ALU pipe. The alternating pairs test the pipe reading directly: two instructions on different pipes should together
issue at about twice the rate of either alone. POPC: the top-k's counting loop issues 128 of them per 4,096-item step
beside ~1,100 ALU instructions (offline SASS). Both ran in session 34's run 1: PRMT shares LOP3's pipe, not IMAD's,
and POPC issues at a quarter of LOP3's rate (flashmla-fp4-table-decode.md, flashmla-topk-exact.md).

Each thread runs 8 interleaved dependency chains of one instruction (32 per loop step, operands from the other
chains so that ptxas can fold nothing); 132 x 8 programs of 4 warps (8 warps per scheduler) for a few ms. Reported:
lane-operations per ns per SM and each rate as a fraction of FFMA's by wall time in the same run. (Run 4's version
also read each program's loop in %clock64 cycles; those implied an FFMA rate above the 128 lanes per clock an SM
has, so the programs were not all resident together, and the clock reading was dropped.)

    cd benchmarks && timeout 100 python3 exp_alu_rates.py
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl
from bench_flashmla import environment

# op: (PTX of one instruction on chain k from chains a, b = the next two; register type)
OPS = {
    "FFMA (fma.rn.f32)": ("fma.rn.f32 {a}, {a}, {b}, {c};", "f32"),
    "LOP3 (lop3.b32)": ("lop3.b32 {a}, {a}, {b}, {c}, 0x96;", "b32"),
    "IMAD (mad.lo.u32)": ("mad.lo.u32 {a}, {a}, {b}, {c};", "b32"),
    "IADD3 (add.u32)": ("add.u32 {a}, {a}, {b};", "b32"),
    "SHF (shf.l.wrap.b32)": ("shf.l.wrap.b32 {a}, {a}, {b}, {c};", "b32"),
    "HMUL2 (mul.rn.bf16x2)": ("mul.rn.bf16x2 {a}, {a}, {b};", "b32"),
    "PRMT, register selector (prmt.b32)": ("prmt.b32 {a}, {b}, {c}, {a};", "b32"),
    "PRMT, immediate selector (prmt.b32)": ("prmt.b32 {a}, {a}, {b}, 0x5140;", "b32"),
    # the top-k's histograms are ballots and population counts (tl.histogram: VOTE, POPC, LOP3; flashmla-topk-exact.md)
    "POPC (popc.b32)": ("popc.b32 {a}, {b};", "b32"),
    # session 34: the converter's high-multiply selector (IMAD.HI) measured slower than the shift it replaced
    # (deepgemm-moe-fold-128.md), and the top-k's packed compare (flashmla-topk-exact.md); added after its run 1
    "IMAD.HI (mul.hi.u32)": ("mul.hi.u32 {a}, {a}, {b};", "b32"),
    "HSET2 (set.ge.u32.bf16x2)": ("set.ge.u32.bf16x2 {a}, {b}, {c};", "b32"),
    # two instructions on alternate chains: twice the rate of either alone when they issue to different pipes
    "LOP3 and IMAD alternating": (("lop3.b32 {a}, {a}, {b}, {c}, 0x96;", "mad.lo.u32 {a}, {a}, {b}, {c};"), "b32"),
    "LOP3 and PRMT alternating": (("lop3.b32 {a}, {a}, {b}, {c}, 0x96;", "prmt.b32 {a}, {b}, {c}, {a};"), "b32"),
    "PRMT and IMAD alternating": (("prmt.b32 {a}, {b}, {c}, {a};", "mad.lo.u32 {a}, {a}, {b}, {c};"), "b32"),
    "PRMT and HMUL2 alternating": (("prmt.b32 {a}, {b}, {c}, {a};", "mul.rn.bf16x2 {a}, {a}, {b};"), "b32"),
    "LOP3 and IMAD.HI alternating": (("lop3.b32 {a}, {a}, {b}, {c}, 0x96;", "mul.hi.u32 {a}, {a}, {b};"), "b32"),
    # session 55: the conversions of the attention's FP8 window rows (e4m3 -> f16 pairs -> bf16; flashmla-gluon.md),
    # against which the integer placement (PRMT, SHF, LOP3, HMUL2 above) was weighed; the 16-bit halves go through
    # {s} / {t}, b16 registers of the chain, which ptxas reads as half-register operands (no moves)
    "F2FP.F16.E4M3 (cvt.rn.f16x2.e4m3x2)": ("mov.b32 {{{s}, {t}}}, {b}; cvt.rn.f16x2.e4m3x2 {a}, {s};", "b32"),
    "F2F.BF16.F16 (cvt.rn.bf16.f16), with a PRMT": ("mov.b32 {{{s}, {t}}}, {b}; cvt.rn.bf16.f16 {s}, {s}; "
                                                     "mov.b32 {a}, {{{s}, {t}}};", "b32"),
    "F2FP.BF16.F32.PACK_AB (cvt.rn.bf16x2.f32)": ("cvt.rn.bf16x2.f32 {a}, {b}, {c};", "b32"),
}
CHAINS = 8
UNROLL = 4  # instructions per chain per asm block


def _asm(op: str | tuple[str, str], typ: str) -> str:
    """One step of the 8 chains, UNROLL instructions each: `op`, or a pair of ops on the even and odd chains."""
    ops = (op, op) if isinstance(op, str) else op
    lines = ["{", f".reg .{typ} a<{CHAINS}>;", f".reg .b16 s<{CHAINS}>, t<{CHAINS}>;"]
    lines += [f"mov.b32 a{k}, ${CHAINS + k};" for k in range(CHAINS)]
    for _ in range(UNROLL):
        for k in range(CHAINS):
            lines.append(ops[k % 2].format(a=f"a{k}", b=f"a{(k + 1) % CHAINS}", c=f"a{(k + 2) % CHAINS}", s=f"s{k}",
                                           t=f"t{k}"))
    lines += [f"mov.b32 ${k}, a{k};" for k in range(CHAINS)]
    return "\n".join(lines + ["}"])


@triton.jit
def _rate_kernel(out_ptr, steps, ASM: tl.constexpr):
    i = tl.arange(0, 128)  # one element per thread (4 warps)
    x = (tl.program_id(0) * 128 + i) * 0x01000193 | 0x3F803F80
    a0, a1, a2, a3, a4, a5, a6, a7 = x, x ^ 1, x ^ 2, x ^ 3, x ^ 4, x ^ 5, x ^ 6, x ^ 7
    for _ in range(steps):
        a0, a1, a2, a3, a4, a5, a6, a7 = tl.inline_asm_elementwise(
            ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r", [a0, a1, a2, a3, a4, a5, a6, a7],
            dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    tl.store(out_ptr + tl.program_id(0) * 128 + i, a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7)


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = sms * 8
    steps = 2048
    out = torch.empty(programs * 128, dtype=torch.int32, device=dev)
    result = environment(dev)
    result.update(programs=programs, warps_per_program=4, steps=steps, chains=CHAINS, unroll=UNROLL, rows=[])
    for name, (op, typ) in OPS.items():
        asm = _asm(op, typ)
        run = lambda: _rate_kernel[(programs,)](out, steps, ASM=asm, num_warps=4)  # noqa: E731
        run()
        ms = triton.testing.do_bench(run, warmup=50, rep=300, return_mode="median")
        ops = programs * 128 * steps * UNROLL * CHAINS
        result["rows"].append(dict(op=name, ms=ms, ops_per_ns=ops / ms / 1e6))
    ffma_ms = result["rows"][0]["ms"]
    with open(os.path.join(os.environ.get("OUT", "."), "exp_alu_rates.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| instruction | lane-ops per ns per SM | of FFMA's rate (wall time) | wall ms |\n|---|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['op']} | {r['ops_per_ns'] / sms:.1f} | {ffma_ms / r['ms']:.2f} | {r['ms']:.3f} |")


if __name__ == "__main__":
    main()
