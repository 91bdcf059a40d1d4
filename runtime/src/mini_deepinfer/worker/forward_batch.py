"""The explicit input of one model forward: what the model runner hands the model each step.

Sequences appear in step order; their query tokens are concatenated. Everything structural is plain host data
known at scheduling time (no device read needed to build it); only `input_ids` lives on the device, so that with
zero-overhead scheduling an in-flight token can be gathered there from the previous step's output buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T] on the model's device
    query_lens: list[int]  # per sequence: tokens computed this step (1 for decode, a chunk for prefill)
    context_lens: list[int]  # per sequence: tokens already in the cache before this step (0 = fresh state)
    block_tables: list[list[int]]  # per sequence: KV block ids covering context_len + query_len tokens
    slots: list[int]  # per sequence: state slot id (window rings, compressor tail, Engram history)
    sample_rows: list[int]  # rows of the T query tokens whose logits are returned, in this order

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def validate(self, block_size: int) -> None:
        n = len(self.query_lens)
        if not (len(self.context_lens) == len(self.block_tables) == len(self.slots) == n):
            raise ValueError("ForwardBatch: per-sequence lists differ in length")
        if self.input_ids.shape != (self.num_tokens,):
            raise ValueError(f"ForwardBatch: input_ids {tuple(self.input_ids.shape)} != ({self.num_tokens},)")
        for i in range(n):
            need = -(-(self.context_lens[i] + self.query_lens[i]) // block_size)
            if len(self.block_tables[i]) < need:
                raise ValueError(f"ForwardBatch: sequence {i} needs {need} blocks, has {len(self.block_tables[i])}")
