"""The explicit input of one model forward: what the model runner hands the model each step.

Sequences appear in step order; their query tokens are concatenated. Everything structural is plain host data
known at scheduling time (no device read needed to build it); only `input_ids` lives on the device, so that with
zero-overhead scheduling an in-flight token can be gathered there from the previous step's output buffer.

The model also needs some of that host data as device tensors (positions, block tables, slots, sampled rows, and
which sequence each row belongs to).
`StepTensors.build` makes them from one pinned host tensor with one non-blocking copy; the runner calls it before
the forward, so the forward itself never copies between host and device (tested under CUDA's sync debug mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def host_to_device(values: list | np.ndarray, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """One tensor from host values, copied to `device` without blocking the host (from pinned memory on CUDA).
    A numpy array converts without a Python-level loop: torch.tensor on a list costs ~150 ns per element."""
    pin = torch.device(device).type == "cuda"
    if isinstance(values, np.ndarray):
        host = torch.from_numpy(values).to(dtype)
        return (host.pin_memory() if pin else host.clone()).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, pin_memory=pin).to(device, non_blocking=True)


@dataclass(frozen=True)
class StepTensors:
    """The device copies of a ForwardBatch's structure (all int64 on the model's device)."""

    positions: torch.Tensor  # [T] position of every query token
    block_tables: torch.Tensor  # [B, width], each table padded with block 0 (the sentinel no sequence owns)
    slots: torch.Tensor  # [B]
    sample_rows: torch.Tensor  # [R]
    row_seq: torch.Tensor  # [T] the sequence (0 .. B-1) of every query token
    context_lens: torch.Tensor  # [B] tokens each sequence had cached before the step
    query_starts: torch.Tensor  # [B + 1] the row of each sequence's first query token, then T

    @staticmethod
    def build(batch: "ForwardBatch", device: torch.device, width: int | None = None) -> "StepTensors":
        """width: block-table columns (default: the longest table). A fixed width gives every step of a kind the
        same shapes, which the decode path's CUDA graphs need."""
        B, T, R = len(batch.query_lens), batch.num_tokens, len(batch.sample_rows)
        longest = max((len(t) for t in batch.block_tables), default=0)
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"StepTensors: block-table width {width} < the longest table ({longest})")
        # one int64 host array, filled row by row by numpy: at 131k context a decode step's tables are ~1,000
        # blocks per sequence, and building them as one Python list for torch.tensor took 12 ms per step at batch
        # 64 (session 15, docs/reports/runtime-decode.md)
        q_lens = np.asarray(batch.query_lens, dtype=np.int64)
        host = np.zeros(T + B * width + B + R + T + B + B + 1, dtype=np.int64)
        parts = np.cumsum([T, B * width, B, R, T, B, B + 1])[:-1]
        positions, tables, slots, sample_rows, row_seq, context_lens, query_starts = np.split(host, parts)
        row_seq[:] = np.repeat(np.arange(B), q_lens)
        query_starts[1:] = np.cumsum(q_lens)
        context_lens[:] = batch.context_lens
        positions[:] = np.arange(T) + (context_lens - query_starts[:-1])[row_seq]
        tables = tables.reshape(B, width)
        for row, t in zip(tables, batch.block_tables):
            row[: len(t)] = t
        slots[:] = batch.slots
        sample_rows[:] = batch.sample_rows
        dev = host_to_device(host, torch.int64, device)
        views = torch.split(dev, [T, B * width, B, R, T, B, B + 1])
        return StepTensors(views[0], views[1].view(B, width), *views[2:])


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T] on the model's device
    query_lens: list[int]  # per sequence: tokens computed this step (1 for decode, a chunk for prefill)
    context_lens: list[int]  # per sequence: tokens already in the cache before this step (0 = fresh state)
    block_tables: list[list[int]]  # per sequence: KV block ids covering context_len + query_len tokens
    slots: list[int]  # per sequence: state slot id (window rings, compressor tail, Engram history)
    sample_rows: list[int]  # rows of the T query tokens whose logits are returned, in this order
    tensors: StepTensors | None = None  # set by the runner before the forward; the model builds it when None

    def device_tensors(self, device: torch.device) -> StepTensors:
        if self.tensors is None:
            self.tensors = StepTensors.build(self, device)
        return self.tensors

    @property
    def is_decode(self) -> bool:
        """Every sequence adds one token to a cache that already holds some: the decode path's static shapes."""
        return bool(self.query_lens) and all(q == 1 for q in self.query_lens) and all(c > 0 for c in self.context_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def validate(self, block_size: int) -> None:
        n = len(self.query_lens)
        if not (len(self.context_lens) == len(self.block_tables) == len(self.slots) == n):
            raise ValueError("ForwardBatch: per-sequence lists differ in length")
        if 0 in self.slots:
            # the model's sentinel: decode rows that write nothing useful write there (model.py), and so do CUDA-graph
            # padding rows, so no sequence may hold it
            raise ValueError(f"ForwardBatch: sequence {self.slots.index(0)} holds state slot 0, the sentinel")
        if self.input_ids.shape != (self.num_tokens,):
            raise ValueError(f"ForwardBatch: input_ids {tuple(self.input_ids.shape)} != ({self.num_tokens},)")
        for i in range(n):
            need = -(-(self.context_lens[i] + self.query_lens[i]) // block_size)
            if len(self.block_tables[i]) < need:
                raise ValueError(f"ForwardBatch: sequence {i} needs {need} blocks, has {len(self.block_tables[i])}")
