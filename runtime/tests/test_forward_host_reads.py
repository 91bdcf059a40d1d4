"""The model forward reads no device value on the host, checked on CPU (the GPU test, test_cuda_decode.py, runs the
real guard: torch.cuda.set_sync_debug_mode("error")).

On CUDA every op below waits for the GPU: reading a value (.item(), int(), bool(), .tolist(), .cpu()), an output
whose size depends on values (nonzero, unique, masked_select, boolean-mask indexing, repeat_interleave with tensor
repeats and no output_size), a tensor built from host data (torch.tensor(list), a blocking copy), or a Python scalar stored through a
tensor index (its 0-d host tensor is copied over first). A dispatch mode records every such
op the forward runs on CPU, with where it was called from. Allowed: mini-flashmla's CPU references of the paged
attention and of the indexer's ragged batch (on CUDA their Triton kernels run instead) and 0-d host constants (a CPU
scalar operand needs no copy).
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mini_deepinfer.models.deepseek_v41 import load_model
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

CPU = torch.device("cpu")
VALUE_DEPENDENT = {"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select",
                   "lift_fresh"}
# mini-flashmla's, mini-deepgemm's: their kernels run on CUDA instead
CPU_ONLY_FALLBACKS = ("sparse_attn_paged_ref", "_ragged_scores_reference", "_reference")


def _caller(stack) -> str:
    frames = [f for f in stack if "site-packages" not in f.filename and "test_forward_host_reads" not in f.filename]
    return " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(frames[-4:]))


class HostReads(TorchDispatchMode):
    """Records (op, caller) of every op that would make the host wait on CUDA."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def _record(self, what: str) -> None:
        stack = traceback.extract_stack()[:-2]
        if not any(f.name in CPU_ONLY_FALLBACKS for f in stack):
            self.found.append(f"{what} at {_caller(stack)}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        flagged = name in VALUE_DEPENDENT and not (name == "lift_fresh" and out.dim() == 0)
        flagged |= (name == "repeat_interleave" and func._overloadname == "Tensor"
                    and (kwargs or {}).get("output_size") is None)
        if name in ("index", "index_put", "index_put_"):
            flagged |= any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        if flagged:
            self._record(str(func))
        return out


@pytest.fixture
def host_reads(monkeypatch):
    """HostReads plus the reads that do not dispatch on CPU tensors (.tolist(), .cpu(), .numpy())."""
    mode = HostReads()
    for method in ("tolist", "cpu", "numpy"):
        original = getattr(torch.Tensor, method)

        def reading(self, *a, _method=method, _original=original, **k):
            mode._record(f"Tensor.{_method}")
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, method, reading)
    setitem = torch.Tensor.__setitem__

    def storing(self, index, value):
        # t[index_tensor] = python_number: on CUDA, index_put_ copies the number over as a 0-d host tensor first, a
        # blocking copy (on CPU the same line dispatches index_fill_, so only this wrapper sees it; session 80's
        # reset_slots did it and its GPU run caught it under the sync debug mode)
        indices = index if isinstance(index, tuple) else (index,)
        if isinstance(value, (int, float, bool)) and any(isinstance(i, torch.Tensor) for i in indices):
            mode._record("a Python number stored through a tensor index")
        return setitem(self, index, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", storing)
    return mode


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random/deepseek-v4.1-flash-1017", "cpu")


def test_prefill_and_decode_forward_read_nothing_back(model, host_reads):
    cache = V41Cache(model.config, 9, 4, "cpu")
    steps = [  # a fresh prefill of two sequences, a chunk continuing one of them next to a fresh one, a decode step
        ForwardBatch(torch.arange(3, 173), [40, 130], [0, 0], [[1], [3, 4]], [1, 2], [39, 169]),
        ForwardBatch(torch.arange(5, 105), [60, 40], [40, 0], [[1, 2], [5]], [1, 3], [59, 99]),
        ForwardBatch(torch.tensor([7, 8, 9]), [1, 1, 1], [100, 130, 40], [[1, 2], [3, 4], [5]], [1, 2, 3], [0, 1, 2]),
    ]
    for i, batch in enumerate(steps):
        batch.tensors = StepTensors.build(batch, CPU, 2 if batch.is_decode else None)
        assert batch.is_decode == (i == 2)
        if batch.is_decode:  # the decode step must take decode_forward (the path CUDA graphs capture)
            assert model.decode_ready(batch.slots, cache)
        with host_reads:
            model(batch, cache)
    assert not host_reads.found, "\n".join(host_reads.found)


def test_the_detector_sees_host_reads(host_reads):
    x = torch.arange(6)
    with host_reads:
        x.tolist()
        x[x > 2].sum()
        int(x[0])
        torch.tensor([1, 2])
        torch.tensor(1.0)  # a 0-d host constant: allowed
    kinds = [f.split(" at ")[0] for f in host_reads.found]
    assert kinds == ["Tensor.tolist", "aten.index.Tensor", "aten._local_scalar_dense.default",
                     "aten.lift_fresh.default"]
