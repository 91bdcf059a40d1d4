"""Chooses between the TileLang kernels, the Triton and Gluon kernels and the pure-torch references.

Triton runs CUDA tensors; with TRITON_INTERPRET=1 it also runs CPU tensors through its interpreter, which lets
the kernels be tested on a machine without a GPU. Gluon (triton.experimental.gluon) kernels run CUDA tensors only,
on the triton release they were measured with. TileLang (optional, not a dependency of the package) runs CUDA
tensors only, for the cases gemm.py routes to it. Without triton everything falls back to reference.py.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def tilelang_importable() -> bool:
    return importlib.util.find_spec("tilelang") is not None


@functools.cache
def gluon_usable() -> bool:
    """True when the Gluon kernels may run: triton 3.6 (the GPU machine's, where they were written and measured;
    Gluon is experimental and its API changes between releases, so other releases take the Triton kernels), unless
    MINI_DEEPGEMM_GLUON=0 turns them off. That switch gives every call (this package's and mini-flashmla's) the
    Triton route, the one a uv-locked install (another triton) or a GPU other than Hopper takes, so that route can be
    tested and timed on the machine that has triton 3.6 (docs/reports/triton-route-on-hopper.md). Read once."""
    if not triton_importable() or os.environ.get("MINI_DEEPGEMM_GLUON", "1") == "0":
        return False
    import triton

    return triton.__version__.startswith("3.6.") and importlib.util.find_spec("triton.experimental.gluon") is not None


@functools.cache
def triton_fp8_moe_enabled() -> bool:
    """Whether the FP8-MMA route's folded MoE calls take gemm_fp4_e4m3_kernel (plain Triton) where the Gluon kernels
    do not run, and fold_fp4_weights folds there: on by default since session 76, MINI_DEEPGEMM_TRITON_FP8_MOE=0 turns
    it off (the bf16-MMA route). On an H100 it beats that route: the decode step 1.19 / 1.23x (medium model, batch
    32 / 64 at 131,072 tokens, session 76 run 1), the prefill step 1.046x (session 75 run 5), and the runtime's core
    GPU tests pass with it (session 76 run 2; docs/reports/triton-route-on-hopper.md). Its tiles have not run on an
    H200, nor on a B200 (where the 256 x 64 tile spills 416 B per thread, offline). Read once."""
    return os.environ.get("MINI_DEEPGEMM_TRITON_FP8_MOE", "1") != "0"


def gluon_runs_on(t: torch.Tensor) -> bool:
    """Where the Gluon kernels (of this package and mini-flashmla) may take tensors like t: CUDA on Hopper (wgmma;
    sm_90 is where they were measured) with triton 3.6 (gluon_usable), not under the interpreter."""
    return (t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1" and gluon_usable()
            and torch.cuda.get_device_capability(t.device) == (9, 0))


def use_triton(t: torch.Tensor) -> bool:
    """True when the kernels (not the references) should handle tensors on t's device."""
    if not triton_importable():
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def sm_count(device: torch.device | int) -> int:
    """SM count of a CUDA device, looked up once (the launchers ask on every call: get_device_properties re-checks
    the device index and count each time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
