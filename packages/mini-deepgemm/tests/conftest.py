import os

import pytest
import torch

# Every test runs on CPU (the pure-torch fallback, or the Triton kernels under TRITON_INTERPRET=1) and, on a
# machine with CUDA, once more on the GPU (marked `gpu`, skipped without CUDA).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
    ),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(params=["fp8_mma", "bf16_mma"])
def mma_path(request, monkeypatch, device):
    """Runs a test with each of the kernel's two scale strategies forced (see gemm_kernel.py); the bf16 one
    applies to UE8M0 scales only."""
    if request.param == "bf16_mma" and device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("triton 3.6's interpreter computes bf16 tl.dot on the raw bits")
    from mini_deepgemm import gemm

    default = gemm.default_config

    def forced(layout, rows_hint, gran_k, ue8m0):
        return {**default(layout, rows_hint, gran_k, ue8m0), "BF16_MMA": ue8m0 and request.param == "bf16_mma"}

    monkeypatch.setattr(gemm, "default_config", forced)
    return request.param
