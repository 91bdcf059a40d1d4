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
