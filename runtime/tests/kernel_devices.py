"""Where the runtime's Triton kernel tests run: on CUDA (marked gpu), or on CPU under the Triton interpreter
(TRITON_INTERPRET=1). CPU CI sets neither, so each kernel test file also runs itself once under the interpreter in a
child process (`run_under_interpreter`): the interpreter is chosen when triton is imported."""

from __future__ import annotations

import os

import pytest
import torch
from mini_deepgemm.testing import run_interpreted

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if torch.cuda.is_available():
    DEVICE, MARKS = "cuda", [pytest.mark.gpu]
elif INTERPRET:
    DEVICE, MARKS = "cpu", []
else:
    DEVICE, MARKS = "cuda", [pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA or TRITON_INTERPRET=1")]
# the child-process test of a kernel file: CPU CI only (CUDA, or a run already under the interpreter, runs the
# kernel tests directly)
interpreter_child = pytest.mark.skipif(torch.cuda.is_available() or INTERPRET, reason="CUDA runs the kernels directly")


def kernel_test(fn):
    """A test that runs the kernels on DEVICE: marked gpu on CUDA, skipped on CPU without the interpreter."""
    for mark in MARKS:
        fn = mark(fn)
    return fn


def run_under_interpreter(test_file: str, *pytest_args: str, timeout: float = 600) -> str:
    """pytest on test_file (pytest_args, e.g. "-k", "name") in a child process with TRITON_INTERPRET=1; asserts that
    it passed and returns its output."""
    out = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, *pytest_args], timeout,
                          expect=" passed")
    assert "failed" not in out, out[-3000:]
    return out


def sum_in_order(planes: torch.Tensor) -> torch.Tensor:
    """fp32 planes [P, ...] added in ascending order from zero, ((0 + p0) + p1) + ...: the order in which the split-K
    planes of layers/linear_fp32.py are defined to be summed (by the MoE routing kernel), as plain fp32 adds."""
    total = torch.zeros_like(planes[0])
    for plane in planes:
        total = total + plane
    return total


# one rounding of the output dtype, relative: the fused kernels sum in another order than their torch references
RELATIVE_BOUND = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-20}


def assert_within_one_rounding(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-6) -> None:
    """A fused kernel's output against its torch reference's: every element within one rounding of the output dtype,
    |got - want| <= RELATIVE_BOUND |want| + atol, and for bf16 on CUDA at least 95% equal (the interpreter casts
    fp32 -> bf16 toward zero, GPU Triton to nearest even, so there only the bound holds)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = RELATIVE_BOUND[want.dtype]
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs()
    assert bool((err <= want.abs() * bound + atol).all()), (err / want.abs().clamp_min(1e-30)).max()
    differing = (got != want).float().mean().item()
    print(f"outputs differing from the reference: {100 * differing:.3f}%")
    if want.dtype == torch.bfloat16 and not INTERPRET:
        assert differing <= 0.05
