import os

import pytest
import torch


@pytest.fixture(scope="module")
def device() -> str:
    """Where the kernel tests run: CUDA, else the CPU under Triton's interpreter (TRITON_INTERPRET=1), else skip."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.importorskip("triton")
        return "cpu"
    pytest.skip("needs CUDA (or TRITON_INTERPRET=1 with triton installed)")
