"""Dispatch + combine across 2 processes: torch backend on CPU (gloo); NVSHMEM and torch backends on 2 GPUs."""

from collections.abc import Callable

import pytest
import torch

from mini_deepep import Buffer
from mini_deepep.buffer import nvshmem_available
from mini_deepep.testing import spawn_ranks


def gpus_with_nvshmem(gpus: int) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """The marks and skips of every NVSHMEM test on `gpus` GPUs."""
    def decorate(test: Callable[[], None]) -> Callable[[], None]:
        for mark in (
            pytest.mark.skipif(not nvshmem_available(), reason="needs nvshmem4py and triton"),
            pytest.mark.skipif(torch.cuda.device_count() < gpus, reason=f"needs {gpus} CUDA GPUs"),
            pytest.mark.multigpu,
            pytest.mark.gpu,
        ):
            test = mark(test)
        return test
    return decorate


two_gpus_with_nvshmem = gpus_with_nvshmem(2)


# Symmetric bytes for the largest scenario: 1024 tokens of hidden 1024 per rank, top-6, 2 ranks.
NVL_BYTES_1024 = Buffer.get_nvl_buffer_size_hint(1024, 1024, 6, 2)


@pytest.mark.parametrize("ranks", [2, 4])
def test_torch_backend_ranks_gloo(ranks: int) -> None:
    spawn_ranks(ranks, ("torch",))


def test_torch_backend_stress_two_ranks_gloo() -> None:
    """The stress driver itself (calls back to back, seeded lags), once through its scenarios."""
    spawn_ranks(2, ("torch",), driver="stress", rounds=5)


@two_gpus_with_nvshmem
def test_nvshmem_and_torch_backends_two_gpus() -> None:
    spawn_ranks(2, ("nvshmem", "torch"), NVL_BYTES_1024, on_gpu=True)


@gpus_with_nvshmem(4)
def test_nvshmem_and_torch_backends_four_gpus() -> None:
    """Issue 9's 4-rank layout: the same scenarios over 4 GPUs (tokens to 3 peers, a rank with none)."""
    spawn_ranks(4, ("nvshmem", "torch"), Buffer.get_nvl_buffer_size_hint(1024, 1024, 6, 4), on_gpu=True)


@two_gpus_with_nvshmem
def test_nvshmem_stress_two_gpus() -> None:
    """20 NVSHMEM rounds on one buffer, back to back, ranks alternately held back (races, buffer reuse).

    A 60 s wait limit instead of 100: a lost signal fails within a short run's time, while a rank
    that is merely slow (a Triton compile on a loaded host) still gets a minute."""
    spawn_ranks(2, ("nvshmem",), NVL_BYTES_1024, on_gpu=True, driver="stress", rounds=20, wait_timeout_s=60.0)


@two_gpus_with_nvshmem
def test_nvshmem_lost_peer_times_out_two_gpus() -> None:
    """A combine the peer never joins gives up after the 5 s wait limit, sets ERROR on both ranks, and later
    calls give up at once (no hang, no silent wait per kernel)."""
    spawn_ranks(2, ("nvshmem",), NVL_BYTES_1024, on_gpu=True, driver="lost_peer", wait_timeout_s=5.0)
