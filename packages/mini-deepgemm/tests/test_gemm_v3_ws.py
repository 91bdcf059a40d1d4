"""The dense V3-recipe kernel on TMA loads with triton's Hopper warp specialization (gemm_v3_ws_kernel.py, session 78).

On CUDA, and on the CPU under TRITON_INTERPRET=1 (CI runs this file once that way, in a subprocess): the kernel at
both of its tiles (triton 3.6's 128 x 128 and the 64 x 128 other releases take) against gemm_kernel's FP8 path (the
same arithmetic in the same order: bitwise on CUDA; the interpreter's numpy dots sum a 128-row tile in another order
than a 64-row one, so there within 1e-12 of DeepGEMM's diff), which the reference bounds (below 1e-5), bf16 output and
fp32 accumulate-into, at ragged M and N (a partial row tile, N not a multiple of 128, one scale row shared by a
partial block). On CUDA (gpu): which calls the public API sends to it.
"""

import os
import subprocess
import sys

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm.testing import block_scaled_operands, calc_diff

pytest.importorskip("triton")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CPU_SHAPES = [(65, 192, 256), (130, 128, 384)]
GPU_SHAPES = [(65, 192, 1280), (300, 576, 5120), (4096, 4608, 5120), (1000, 5120, 2304), (4096, 512, 5120)]
TILES = [gemm.V3_WS_TILE_36, gemm.V3_WS_TILE_OTHER]


@pytest.fixture
def runner(device: str) -> str:
    """conftest's device (cuda: marked gpu), where the kernel can run: CUDA, or the CPU under TRITON_INTERPRET=1."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    return device


def gemm_kernel_v3(aq, sa, bq, sb, d, c=None):
    """The same call on gemm_kernel's FP8 path (an explicit config keeps it off gemm_v3_ws_kernel)."""
    cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4, BF16_MMA=False)
    gemm._gemm(gemm._DENSE, (aq, sa), (bq, sb), d, c, None, gemm.V3_RECIPE, False, config=cfg)


@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_the_kernel_equals_gemm_kernel_bitwise(runner, gen, tile, monkeypatch):
    monkeypatch.setattr(gemm, "_v3_ws_tile", lambda: tile)

    def same(x, y):
        return torch.equal(x, y) if runner == "cuda" else calc_diff(x, y) < 1e-12

    for M, N, K in CPU_SHAPES if runner == "cpu" else GPU_SHAPES:
        aq, sa, bq, sb = (t.to(runner) for t in block_scaled_operands(M, N, K, 128, "fp32", gen))
        d = torch.empty(M, N, dtype=torch.bfloat16, device=runner)
        gemm._v3_ws_gemm(aq, sa.contiguous(), bq, sb.contiguous(), d, None)
        ref = torch.empty_like(d)
        gemm_kernel_v3(aq, sa, bq, sb, ref)
        assert same(d, ref), (M, N, K)
        assert calc_diff(d, reference.gemm_nt_ref(aq, sa, bq, sb, 128, 128)) < 1e-5, (M, N, K)
        # accumulate into c (fp32), in place as the API allows
        c = torch.randn(M, N, device=runner)
        d32, ref32 = c.clone(), c.clone()
        gemm._v3_ws_gemm(aq, sa.contiguous(), bq, sb.contiguous(), d32, d32)
        gemm_kernel_v3(aq, sa, bq, sb, ref32, ref32)
        assert same(d32, ref32), (M, N, K)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_which_dense_calls_take_the_kernel(gen, monkeypatch):
    """On a Hopper GPU: dense V3 calls of more than 64 rows with TMA-ready operands that the Gluon kernel does not take;
    not V4.1's recipe, not 64 rows or fewer, not an operand whose row stride is not 16-byte aligned."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernel is routed on Hopper only")
    monkeypatch.setattr(gemm, "_use_gluon_v3", lambda *args: False)
    calls = []
    real = gemm._v3_ws_gemm
    monkeypatch.setattr(gemm, "_v3_ws_gemm", lambda *args: calls.append(args[0].shape) or real(*args))

    def run(M, K, recipe_block=128, pad=0):
        aq, sa, bq, sb = (t.cuda() for t in block_scaled_operands(M, 256, K, recipe_block,
                                                                   "fp32" if recipe_block == 128 else "ue8m0", gen))
        if pad:  # an A whose rows are K + pad bytes apart
            aq = torch.nn.functional.pad(aq.view(torch.uint8), (0, pad)).view(torch.float8_e4m3fn)[:, :K]
        d = torch.empty(M, 256, dtype=torch.bfloat16, device="cuda")
        gemm.fp8_gemm_nt((aq, sa), (bq, sb), d)
        return calc_diff(d, reference.gemm_nt_ref(aq, sa, bq, sb, recipe_block, recipe_block))

    assert run(65, 256) < 1e-5 and calls == [(65, 256)]
    assert run(64, 256) < 1e-5 and len(calls) == 1
    assert run(130, 256, pad=8) < 1e-5 and len(calls) == 1
    assert run(130, 256, recipe_block=32) < 1e-5 and len(calls) == 1


def test_the_kernel_runs_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's kernel test once under TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "bitwise and cpu"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
