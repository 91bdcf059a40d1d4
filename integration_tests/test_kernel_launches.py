"""Every Triton / Gluon kernel launch in the packages and the runtime states enable_fp_fusion=True, checked from the
source alone.

Why: whether `a * b + c` compiles to one FMA or to a multiply and an add is triton's default unless a launch says
so, and triton 3.10 turns that default off. Under triton 3.6 with the default off, 14 of the kernels the sm_90
compile tests build compile differently: the MMA kernels' scale promotions lose their FMAs (the V3 GEMM 1,512 ->
1,768 SASS instructions, the contiguous MoE kernel 2,568 -> 3,128 and a 24-byte spill) and the quantizers', norms',
rope's and sampler's roundings move. Every bit-exact test and every timing in docs/reports was made with fusion on
(docs/reports/kernels-compile-sm90.md, "Session 49"). A launch is `NAME[grid](...)` with NAME ending in `_kernel`.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def kernel_launches() -> list[tuple[str, int, str, ast.Call]]:
    """(file, line, kernel name, call) of every `*_kernel[grid](...)` in packages/*/src and runtime/src."""
    launches = []
    for path in sorted([*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("runtime/src/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                target = node.func.value
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                if name.endswith("_kernel"):
                    launches.append((str(path.relative_to(ROOT)), node.lineno, name, node))
    return launches


def test_every_kernel_launch_states_fp_fusion() -> None:
    launches = kernel_launches()
    assert len(launches) >= 45  # the launches of session 49; fewer means the walk lost some
    missing = [f"{file}:{line} {name}" for file, line, name, call in launches
               if not any(k.arg == "enable_fp_fusion" and isinstance(k.value, ast.Constant) and k.value.value is True
                          for k in call.keywords)]
    assert not missing, "launches without enable_fp_fusion=True:\n" + "\n".join(missing)
