"""Every kernel the public APIs launch on a B200 (sm_100a, the seeds' target) compiles and fits, on the CPU.

Why: the kernels are written and measured on H200s, and the project keeps them portable (Triton retargets), but no
GPU here is a B200, so nothing else checks that a call made there would launch. There the Gluon kernels (Hopper's
wgmma) are never routed, and the Triton route compiles for sm_100a instead. Session 51 found one kernel that would
not have launched: the bf16-rows attention at 2 stages took 262,944 B of shared memory on sm_100a, more than a
program may have (it takes 1 stage there now: mini_flashmla.api._attn_launch).

How: the three sm_90 files' cases (test_compile_sm90_*.py: the same calls at V4.1 shapes) inside
sm90_compile.compiling_for(B200). Each call must launch the kernels of the Triton route, and each kernel must fit:
shared memory <= 232,448 B and registers x threads <= 65,536, as on sm_90. Local memory (spills) is printed, not
bounded: nobody has timed these kernels on sm_100. The FP8-MMA cases of mini_deepgemm (folded weights) compile
gemm_fp4_e4m3_kernel, as the Triton route takes them by default (MINI_DEEPGEMM_TRITON_FP8_MOE). A compile is all
this shows: not speed, and not results.

    uv run pytest -s integration_tests/test_compile_sm100.py       # -s prints each kernel's resources
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sm90_compile import B200, compiling_for

import test_compile_sm90_deepgemm as deepgemm_cases
import test_compile_sm90_flashmla as flashmla_cases
import test_compile_sm90_runtime as runtime_cases
from mini_deepgemm import gemm
from mini_flashmla import api as flashmla_api


def cases() -> list:
    """(id, call(monkeypatch), the kernels the call launches on the Triton route, in order)."""
    out = [pytest.param(lambda _mp, c=c: c.call(), c.triton, id=f"deepgemm/{c.name}")
           for c in deepgemm_cases.CASES]
    out += [pytest.param(lambda _mp, c=c: c.call(), [name for name, _ in c.triton_launches], id=f"flashmla/{c.name}")
            for c in flashmla_cases.CASES]
    out += [pytest.param(c.call, list(c.kernels), id=f"runtime/{c.id}") for c in runtime_cases.cases() if not c.xfail]
    return out


@pytest.mark.parametrize("call,kernels", cases())
def test_compiles_for_sm100_and_fits(call: Callable[[pytest.MonkeyPatch], None], kernels: list[str],
                                     monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    monkeypatch.setattr(flashmla_api, "_num_sms", lambda device: B200.sms)  # it answers 8 for a CPU device
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: True, raising=False)  # whatever the env says
    with compiling_for(B200) as compiled:
        call(monkeypatch)
    for k in compiled:
        print(k.row(request.node.callspec.id))
    assert [k.name for k in compiled] == kernels, "the B200's route"
    assert [p for k in compiled for p in k.fits()] == []
