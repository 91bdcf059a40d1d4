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


@pytest.fixture(params=["fp8_mma", "bf16_mma", "swap_ab"])
def mma_path(request, monkeypatch, device):
    """Runs a test with each of the kernels' scale strategies forced: gemm_kernel's FP8 MMAs + promotion or
    bf16-dequant MMAs, or gemm_swapab_kernel; the last two apply to UE8M0 scales only."""
    if request.param != "fp8_mma" and device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("triton 3.6's interpreter computes bf16 tl.dot on the raw bits")
    from mini_deepgemm import gemm

    default, legacy = gemm.default_config, gemm.gemm_kernel_config

    def forced(layout, rows_hint, gran_k, ue8m0, n=0, groups=1, fp4=False):
        if request.param == "swap_ab" and ue8m0 and layout != gemm._DENSE:  # tiles by rows per group
            return default(layout, rows_hint, gran_k, ue8m0, n, groups, fp4)
        if request.param == "swap_ab" and ue8m0:  # few-token tiles at M <= 32, else the large-M tiles
            cfg = default(layout, rows_hint if rows_hint <= 32 else max(rows_hint, 4096), gran_k, ue8m0,
                          max(n, 4608), fp4=fp4)
            return {k: v for k, v in cfg.items() if k != "GLUON_V41"}  # the swap-AB kernel, not the Gluon one
        return {**legacy(layout, rows_hint, gran_k, ue8m0), "BF16_MMA": ue8m0 and request.param == "bf16_mma"}

    monkeypatch.setattr(gemm, "default_config", forced)
    return request.param
