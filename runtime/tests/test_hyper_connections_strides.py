"""The fused hyper-connection wrappers (layers/hyper_connections.py) on streams that are dense but not contiguous.

The kernels index their outputs as contiguous [T, 4, D]; an output allocated with torch.empty_like(H) would keep
the strides of a permuted H and receive its rows in the wrong places. Runs on CUDA (marked gpu), and on CPU under
the Triton interpreter (TRITON_INTERPRET=1; CI does that through the subprocess test at the end).
"""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41 import ops

from kernel_devices import INTERPRET, run_under_interpreter

pytestmark = pytest.mark.skipif(hcf.triton is None, reason="needs triton")

if torch.cuda.is_available():
    DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu)]
elif INTERPRET:
    DEVICES = ["cpu"]
else:
    DEVICES = [pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
def test_permuted_streams_give_contiguous_outputs_equal_to_the_contiguous_case(device: str) -> None:
    T, D = 5, 64
    g = torch.Generator().manual_seed(3)
    H = torch.randn(4, T, D, generator=g).to(torch.bfloat16).to(device).transpose(0, 1)  # [T, 4, D], stream-major
    y = torch.randn(T, D, generator=g).to(torch.bfloat16).to(device)
    pre, post = (torch.rand(T, 4, generator=g).to(device) for _ in range(2))
    comb = torch.rand(T, 4, 4, generator=g).to(device)
    assert not H.is_contiguous()

    expanded = hcf.hc_expand_fused(y, H, post, comb)
    assert expanded.is_contiguous()
    assert torch.equal(expanded, hcf.hc_expand_fused(y, H.contiguous(), post, comb))
    assert torch.equal(hcf.hc_collapse_fused(H, pre), hcf.hc_collapse_fused(H.contiguous(), pre))
    # and the values are the reference's, within one bf16 rounding
    want = ops.hc_expand(y, H, post, comb).float()
    assert bool(((expanded.float() - want).abs() <= want.abs() * 2**-7 + 1e-6).all())


@pytest.mark.skipif(torch.cuda.is_available() or INTERPRET,
                    reason="CUDA (or an interpreter run) executes the test above directly")
def test_runs_under_the_triton_interpreter_on_cpu() -> None:
    """CI has no GPU: run the test above once under TRITON_INTERPRET=1, in a subprocess (the interpreter is chosen
    when the kernels are defined)."""
    assert "1 passed" in run_under_interpreter(__file__, "-k", "permuted", timeout=300)
