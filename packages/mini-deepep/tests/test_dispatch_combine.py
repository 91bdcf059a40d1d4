"""Dispatch + combine across 2 processes: torch backend on CPU (gloo); NVSHMEM and torch backends on 2 GPUs."""

import pytest
import torch

from mini_deepep import Buffer
from mini_deepep.buffer import nvshmem_available
from mini_deepep.testing import spawn_ranks


def test_torch_backend_two_ranks_gloo() -> None:
    spawn_ranks(2, ("torch",))


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.skipif(not nvshmem_available(), reason="needs nvshmem4py and triton")
def test_nvshmem_and_torch_backends_two_gpus() -> None:
    spawn_ranks(2, ("nvshmem", "torch"), Buffer.get_nvl_buffer_size_hint(1024, 1024, 6, 2), on_gpu=True)
