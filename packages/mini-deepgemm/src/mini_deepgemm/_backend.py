"""Chooses between the TileLang kernels, the Triton kernels and the pure-torch references.

Triton runs CUDA tensors; with TRITON_INTERPRET=1 it also runs CPU tensors through its interpreter, which lets
the kernels be tested on a machine without a GPU. TileLang (optional, not a dependency of the package) runs
CUDA tensors only, for the cases gemm.py routes to it. Without triton everything falls back to reference.py.
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


def use_triton(t: torch.Tensor) -> bool:
    """True when the kernels (not the references) should handle tensors on t's device."""
    if not triton_importable():
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
