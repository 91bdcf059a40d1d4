"""Registers, spills and shared memory of the NVSHMEM data kernels, compiled offline for sm_90a (no GPU needed).

    python packages/mini-deepep/tools/kernel_registers.py [--fingerprints]     # with triton 3.6, the GPU machine's

--fingerprints prints a hash of each data kernel variant's PTX instead, to show that a refactor leaves the code the
GPU runs unchanged.

(Under the uv environment's triton 3.9 the PTX is version 9.4, which the ptxas in its wheel, 8.8, rejects.)

How many programs an SM holds follows from these: 8 warps x 32 threads x registers must fit in 65,536, so a kernel
at more than 128 registers runs one program per SM, and a grid of two per SM runs in two waves. The shapes are the
benchmark's (2 ranks, hidden 5,120, top-6 of 384 experts). Pointers and the integer arguments that are multiples of
16 at run time get Triton's 16-byte divisibility hint, as its launcher gives them; without it nothing vectorizes and
the counts are far higher than on the GPU. Only triton is imported (the package's __init__ needs torch, so it is
bypassed).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SRC = Path(__file__).resolve().parents[1] / "src"
package = types.ModuleType("mini_deepep")
package.__path__ = [str(SRC / "mini_deepep")]
sys.modules["mini_deepep"] = package  # the kernels alone, without mini_deepep/__init__.py (torch)

from mini_deepep import nvshmem_layout as L  # noqa: E402
from mini_deepep.kernels.combine import combine_kernel  # noqa: E402
from mini_deepep.kernels.dispatch import dispatch_kernel  # noqa: E402

# The flag units the backend launches with (nvshmem_layout), not copies of their values.
DISPATCH_UNITS = {"CHUNK": L.CHUNK, "MAX_CHUNKS": L.MAX_CHUNKS}
COMBINE_UNITS = {"GROUP": L.GROUP, "MAX_GROUPS": L.MAX_GROUPS}

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
# Argument types by name (the kernels' signatures); everything else is an int32 pointer.
TYPES = {
    "buf64": "*i64", "peer_offsets": "*i64", "topk_idx": "*i64", "trace": "*i64",
    "buf16": "*bf16", "y": "*bf16", "out": "*bf16", "topk_weights": "*fp32", "row_weights": "*fp32",
    "epoch": "i64", "consumed_target": "i64", "timeout_ns": "i64", "rank": "i32", "two_pass_from": "i32",
    "expert_counts_offset": "i32", "notify_offset": "i32", "count_offset": "i32", "source_tokens_offset": "i32",
    "notified_offset": "i32",
}
INTS_16 = ("num_tokens", "num_rows", "slots", "m_alignment", "data_offset", "meta_offset", "flags_offset",
           "ranges_offset", "combine_offset", "consumed_offset", "error_offset", "queue_offset")


def _compile(kernel, constexprs: dict[str, int], num_warps: int, maxnreg: int | None = None):
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in constexprs else TYPES.get(p, "i32" if p in INTS_16 else "*i32") for p in params}
    aligned = [i for i, p in enumerate(params) if signature[p].startswith("*") or p in INTS_16]
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(params.index(k),): v for k, v in constexprs.items()},
                       attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def ptx_fingerprint(kernel, constexprs: dict[str, int], num_warps: int = 8) -> str:
    """Hash of the kernel's PTX instructions and branch labels, without what only debug info holds (sections,
    .loc / .file lines, comments, the $L__tmp scope markers of inlined helpers): equal before and after a refactor
    means the GPU runs the same code, so the GPU tests of the earlier tree hold for the later one."""
    code = _compile(kernel, constexprs, num_warps).asm["ptx"].split(".section")[0]
    lines = [line.split("//")[0].strip() for line in code.splitlines()]
    kept = [re.sub(r"\$L__BB\w+", "L", line) for line in lines
            if line and not line.startswith((".loc", ".file", "$L__tmp"))]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def compile_sm90(kernel, constexprs: dict[str, int], num_warps: int,
                 maxnreg: int | None = None) -> tuple[int, int, int]:
    """(registers, spill store bytes, shared memory bytes) of `kernel` at these constexprs (and register cap)."""
    compiled = _compile(kernel, constexprs, num_warps, maxnreg)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([str(PTXAS), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                                capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    return registers, spills, compiled.metadata.shared


def fingerprints() -> None:
    """PTX fingerprints of 12 variants: dispatch (bf16, FP8) and combine, at 2 and 8 ranks, trace off and on."""
    for ranks in (2, 8):
        for trace in (False, True):
            common = {"NUM_RANKS": ranks, "TOPK": 6, "TOPK_BLOCK": 8, "TRACE": trace}
            for fp8 in (False, True):
                dispatch = dict(common, **DISPATCH_UNITS, NUM_SENDERS=33, EXPERTS_PER_RANK=384 // ranks,
                                A_WORDS=1280 if fp8 else 2560,
                                B_WORDS=40 if fp8 else 0, ROW_HEAD=1024 if fp8 else 2048, ROW_TAIL=256 if fp8 else 512,
                                B_BLOCK=64 if fp8 else 16, META_WORDS=19, META_BLOCK=32, TILE=8, FUSED_NOTIFY=False,
                                EXPERT_BLOCK=triton.next_power_of_2(384 // ranks),
                                MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS)
                print(f"dispatch {'fp8' if fp8 else 'bf16'}, {ranks} ranks, trace {trace}:",
                      ptx_fingerprint(dispatch_kernel, dispatch))
            combine = dict(common, **COMBINE_UNITS, NUM_SENDERS=132, RANK_BLOCK=triton.next_power_of_2(ranks),
                           HIDDEN=5120, ROW_TOKENS=2, ROW_HEAD=4096, ROW_TAIL=1024, TILE=8, COLS=512, ONE_PASS=False)
            print(f"combine, {ranks} ranks, trace {trace}:", ptx_fingerprint(combine_kernel, combine))


def main() -> None:
    if "--fingerprints" in sys.argv:
        fingerprints()
        return
    common = {"NUM_RANKS": 2, "TOPK": 6, "TOPK_BLOCK": 8, "TRACE": False}
    dispatch = dict(common, **DISPATCH_UNITS, NUM_SENDERS=33, EXPERTS_PER_RANK=192, A_WORDS=2560, B_WORDS=0,
                    ROW_HEAD=2048, ROW_TAIL=512, B_BLOCK=16, META_WORDS=19, META_BLOCK=32, FUSED_NOTIFY=False,
                    EXPERT_BLOCK=256, MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS)
    combine = dict(common, **COMBINE_UNITS, NUM_SENDERS=132, RANK_BLOCK=2, HIDDEN=5120, ROW_TOKENS=2, ROW_HEAD=4096,
                   ROW_TAIL=1024, ONE_PASS=False)
    cases = [
        ("dispatch bf16, 8-row tiles (default)", dispatch_kernel, dict(dispatch, TILE=8)),
        ("dispatch bf16, 4-row tiles", dispatch_kernel, dict(dispatch, TILE=4)),
        ("dispatch bf16, 8-row tiles, fused notify", dispatch_kernel, dict(dispatch, TILE=8, FUSED_NOTIFY=True)),
        ("combine, 8 x 512 tiles (default)", combine_kernel, dict(combine, TILE=8, COLS=512)),
        ("combine, 8 x 1,024 tiles", combine_kernel, dict(combine, TILE=8, COLS=1024)),
        ("combine, 4 x 1,024 tiles", combine_kernel, dict(combine, TILE=4, COLS=1024)),
        ("combine v7 (ONE_PASS), 8 x 512 tiles", combine_kernel, dict(combine, TILE=8, COLS=512, ONE_PASS=True)),
    ]
    # The backend launches combine at two programs per SM with maxnreg = 65,536 / (2 x 256) = 128
    # (nvshmem_backend.register_budget): the last columns are what ptxas makes of that cap.
    capped = 65536 // (2 * 256)
    print(f"{'kernel (8 warps, sm_90a)':40s} {'registers':>9s} {'spills B':>8s} {'shared B':>8s} {'programs/SM':>11s}"
          f" {'spills B at ' + str(capped):>15s}")
    for name, kernel, constexprs in cases:
        registers, spills, shared = compile_sm90(kernel, constexprs, 8)
        capped_spills = compile_sm90(kernel, constexprs, 8, capped)[1] if kernel is combine_kernel else ""
        print(f"{name:40s} {registers:9d} {spills:8d} {shared:8d} {65536 // (256 * registers):11d} {capped_spills:>15}")


if __name__ == "__main__":
    main()
