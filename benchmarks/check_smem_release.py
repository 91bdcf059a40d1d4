"""Offline check (no GPU): does a Gluon kernel release a TMA-filled shared-memory slot while one of its shared-memory
loads from it may still be in flight?

Why (session 38, docs/reports/deepgemm-moe-fold-128.md): exp_moe_converter_sync's raw8 variant (commit 0b99c15)
gave wrong rows (19-72% of them) until its converter, which reads a slot with LDS and then arrives on the barrier
that lets the TMA producer refill it, fenced first (fence.proxy.async) or arrived only after a later fence. Its SASS
showed the cause: the last LDS.128 of the slot was issued just before the partition's BAR.SYNC and its registers
were first read after the arrive. BAR.SYNC orders the load against the CTA's other threads, not against the TMA
unit's write, so the refill could land before the load read the slot. The pattern is decided by ptxas's schedule,
so it is checked on the SASS.

What: each of the package's warp-specialized or TMA-fed Gluon kernels is compiled for sm_90 through its own launcher
in mini_deepgemm.gemm, with CPU tensors, under integration_tests/sm90_compile.py (launches compile, they do not run).
In the SASS, for every plain mbarrier arrive (SYNCS.ARRIVE.TRANS64.A1T0, a release) and every TMA load issue
(UTMALDG, a refill by the same warps), it lists the LDS / LDSM loads since the previous barrier operation or memory
fence whose destination registers are not read before that point but are read after it. An empty list means no load
can still be in flight at a release; a hit is worth a look (its slot may be one that is not being released).

    cd benchmarks && python3 check_smem_release.py      # needs triton (3.6 as on the GPU machine) and torch

Prints one line per kernel and configuration, then the hits.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path[:0] = [os.path.join(ROOT, "packages", "mini-deepgemm", "src"), os.path.join(ROOT, "integration_tests")]
from mini_deepgemm import gemm as G
from sm90_compile import compiling_for_sm90

_LOAD = re.compile(r"^(@!?U?P\w+\s+)?(LDS(M)?[.\w]*)\s+R(\d+)")
_RELEASE = ("SYNCS.ARRIVE.TRANS64.A1T0", "UTMALDG")
_WINDOW_START = ("SYNCS.", "MEMBAR", "FENCE", "UTMALDG")


def _opcode_operands(instruction: str) -> tuple[str, str]:
    """(opcode, operands) of an instruction, its predicate dropped."""
    opcode, _, operands = re.sub(r"^@!?U?P\w+\s+", "", instruction).partition(" ")
    return opcode, operands


def _sources(instruction: str) -> str:
    """The operands an instruction reads: all but the first (its destination), or all for stores and barriers."""
    opcode, operands = _opcode_operands(instruction)
    if opcode.startswith(("ST", "SYNCS", "BAR", "UTMA", "RED", "ATOM")):
        return operands
    return operands.partition(",")[2]


def _writes(instruction: str, reg: int) -> bool:
    opcode, operands = _opcode_operands(instruction)
    return not opcode.startswith(("ST", "SYNCS", "BAR", "UTMA")) and re.match(rf"R{reg}\b", operands) is not None


def loads_in_flight_at_release(sass: list[str]) -> list[str]:
    """For every release in sass: the loads whose registers are first read after it (module docstring)."""
    hits = []
    for i, op in enumerate(sass):
        if not any(r in op for r in _RELEASE):
            continue
        j = i - 1
        while j >= 0 and not any(w in sass[j] for w in _WINDOW_START):
            j -= 1
        for k in range(j + 1, i):
            m = _LOAD.match(sass[k])
            if not m:
                continue
            width = int(re.search(r"\.x(\d)", m.group(2)).group(1)) if m.group(3) and ".x" in m.group(2) else \
                {"128": 4, "64": 2}.get(m.group(2).rsplit(".", 1)[-1], 1)
            for reg in range(int(m.group(4)), int(m.group(4)) + width):
                if any(re.search(rf"\bR{reg}\b", _sources(sass[t])) for t in range(k + 1, i)):
                    continue
                for t in range(i + 1, len(sass)):
                    if re.search(rf"\bR{reg}\b", _sources(sass[t])):
                        hits.append(f"{_opcode_operands(op)[0]} at {i}: R{reg} of '{sass[k][:48]}' at {k}, first "
                                    f"read at {t}")
                        break
                    if _writes(sass[t], reg):
                        break
    return hits


def _fp4_operands(groups: int, n: int, k: int, rows: int, masked: bool):
    """CPU operands of the FP8-MMA MoE route (values irrelevant: only compiled)."""
    aq = torch.empty((groups, rows, k) if masked else (rows, k), dtype=torch.float8_e4m3fn)
    sa = torch.empty(aq.shape[:-1] + (k // 128,), dtype=torch.float32)
    bq = torch.empty(groups, n, k // 2, dtype=torch.uint8)
    d = torch.empty(aq.shape[:-1] + (n,), dtype=torch.bfloat16)
    folded = G.FoldedFP4Scales(torch.empty(groups, n, k // 128, dtype=torch.int32),
                               torch.empty(groups, n, dtype=torch.float32))
    return aq, sa, bq, d, folded


def configurations() -> dict[str, Callable[[], None]]:
    """name -> a call of a launcher in mini_deepgemm.gemm with the configuration the package routes to."""
    m, n, k, groups = 4096, 4608, 5120, 8

    # 4,096 rows over `experts`, M / experts - 64 real rows each (gemm._contiguous_rows): 32 experts, 64 rows: the
    # contiguous kernel's 128-row tiles; 8, 448 rows: its 256-row tiles. (64 experts, 0 rows, took the swap-AB kernel
    # since session 54's route, so this check had not looked at the 128-row tiles since.)
    def contiguous(experts: int):
        def call():
            aq, sa, bq, d, folded = _fp4_operands(experts, n, k, m, False)
            G._fp4_e4m3_gemm(G._CONTIGUOUS, (aq, sa), (bq, None), d, torch.empty(m, dtype=torch.int32), folded,
                             None)
        return call

    def masked(expected_m: int):
        def call():
            aq, sa, bq, d, folded = _fp4_operands(groups, n, k, 128, True)
            G._fp4_e4m3_gemm(G._MASKED, (aq, sa), (bq, None), d, torch.empty(groups, dtype=torch.int32), folded,
                             expected_m)
        return call

    def dense_v3():
        aq, bq = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
        G._gluon_fp8_v3_gemm(aq, torch.empty(m, k // 128), bq, torch.empty(n // 128, k // 128),
                             torch.empty(m, n, dtype=torch.bfloat16),
                             {"GLUON_BLOCK_M": 128, "GLUON_STAGES": 4, "GLUON_PROGRAMS_PER_SM": 1, "GROUP_M": 8})

    def dense_v41(scales_in_ring: bool):
        def call():
            aq, bq = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
            G._gluon_fp8_v41_gemm(aq, torch.empty(m, k // 32, dtype=torch.uint8), bq,
                                  torch.empty(n // 32, k // 32, dtype=torch.uint8),
                                  torch.empty(m, n, dtype=torch.bfloat16), 128, 128, 4, 1, scales_in_ring)
        return call

    def fp4_contiguous_ws():
        x = torch.empty(m, k, dtype=torch.bfloat16)  # _dequant_activations' output
        G._gluon_fp4_contiguous_ws_gemm(x, torch.empty(groups, n, k // 2, dtype=torch.uint8),
                                        torch.empty(groups, n, k // 32, dtype=torch.uint8),
                                        torch.empty(m, n, dtype=torch.bfloat16), torch.empty(m, dtype=torch.int32), 4)

    return {"fp4_e4m3 contiguous, 128-row tiles": contiguous(32), "fp4_e4m3 contiguous, 256-row tiles": contiguous(8),
            "fp4_e4m3 masked, 16 tokens": masked(8),
            "fp4_e4m3 masked, 32 tokens": masked(32), "fp4_e4m3 masked, 64 tokens": masked(64),
            "fp8 v3 dense": dense_v3, "fp8 v41 dense": dense_v41(False),
            "fp8 v41 dense, scales in ring": dense_v41(True),
            "fp4 contiguous warp-specialized": fp4_contiguous_ws}


def main() -> None:
    for name, launch in configurations().items():
        with compiling_for_sm90() as kernels:
            launch()
        for kernel in kernels:
            hits = loads_in_flight_at_release(kernel.sass())
            print(f"{name}: {kernel.name}: {len(hits)} loads in flight at a release")
            for hit in hits:
                print(f"    {hit}")


if __name__ == "__main__":
    main()
