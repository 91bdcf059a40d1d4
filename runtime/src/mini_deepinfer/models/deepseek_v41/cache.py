"""The engine's V4.1 attention state: paged blocks for what grows with the sequence, one slot for what does not.

| state | owner | layout (per layer) | bytes |
|---|---|---|---|
| compressed main KV (kv sources) | KV blocks | uint8 [num_blocks * epb, 288], epb = 128 / ratio | 288 / entry |
| index keys (kv sources) | KV blocks | uint8 [num_blocks * epb, 68] | 68 / entry |
| window ring (every layer) | state slot | uint8 [num_slots * 128, 528], row = slot * 128 + pos % 128 | 528 / token |
| compressor tail (ratio > 1 sources) | state slot | fp32 [num_slots, ratio, 512] kv and score (score -inf when empty) | 8 KiB |
| Engram history | state slot | int64 [num_slots, max_ngram - 1] compressed ids | |
| index-key publisher (spec 2.4 quirk) | state slot | host list [num_slots], layer id or -1, and its device copy | |

A block covers BLOCK_SIZE = 128 token positions: compressed entry g of a ratio-r layer lives in the sequence's
block g // epb at row g % epb. Rows are stored packed (mini_flashmla.cache_layout), which is bit-identical to the
reference's fake-quantized bf16 values. Block 0 is allocated like any other; the block manager never hands it out.
"""

from __future__ import annotations

import torch
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, INDEX_K_ROW_BYTES, WINDOW_ROW_BYTES

from mini_deepinfer.models.deepseek_v41.config import LayerMode, V41Config

BLOCK_SIZE = 128


class V41Cache:
    def __init__(self, config: V41Config, num_blocks: int, num_slots: int, device: str | torch.device = "cpu"):
        self.cfg = config
        self.num_blocks, self.num_slots = num_blocks, num_slots
        self.device = torch.device(device)
        W, D = config.sliding_window, config.head_dim
        self.window: dict[int, torch.Tensor] = {}
        self.compressed_kv: dict[int, torch.Tensor] = {}
        self.index_k: dict[int, torch.Tensor] = {}
        self.comp_kv_state: dict[int, torch.Tensor] = {}
        self.comp_score_state: dict[int, torch.Tensor] = {}
        for role in config.layer_roles:
            lid = role.layer_id
            self.window[lid] = torch.zeros(num_slots * W, WINDOW_ROW_BYTES, dtype=torch.uint8, device=self.device)
            if role.mode == LayerMode.FULL:
                epb = BLOCK_SIZE // role.ratio
                self.compressed_kv[lid] = torch.zeros(num_blocks * epb, COMPRESSED_KV_ROW_BYTES, dtype=torch.uint8,
                                                      device=self.device)
                self.index_k[lid] = torch.zeros(num_blocks * epb, INDEX_K_ROW_BYTES, dtype=torch.uint8,
                                                device=self.device)
                if role.ratio > 1:
                    self.comp_kv_state[lid] = torch.zeros(num_slots, role.ratio, D, device=self.device)
                    self.comp_score_state[lid] = torch.full((num_slots, role.ratio, D), float("-inf"),
                                                            device=self.device)
        self.engram_history = torch.zeros(num_slots, config.engram_max_ngram_size - 1, dtype=torch.int64,
                                          device=self.device)
        # which layer's index keys a ratio-2 source scores against follows from the schedule alone: the host list
        # decides (decode_ready, the indexer's groups); the device copy, written beside it in every forward, lets the
        # general forward's indexer pick each group's sequences without a copy from the host (model._indexer)
        self.index_k_publisher: list[int] = [-1] * num_slots
        self.index_k_publisher_device = torch.full((num_slots,), -1, dtype=torch.int64, device=self.device)

    @staticmethod
    def bytes_per_block(config: V41Config) -> int:
        total = 0
        for role in config.layer_roles:
            if role.mode == LayerMode.FULL:
                total += (BLOCK_SIZE // role.ratio) * (COMPRESSED_KV_ROW_BYTES + INDEX_K_ROW_BYTES)
        return total

    @staticmethod
    def bytes_per_slot(config: V41Config) -> int:
        total = config.num_hidden_layers * config.sliding_window * WINDOW_ROW_BYTES
        for role in config.layer_roles:
            if role.mode == LayerMode.FULL and role.ratio > 1:
                total += 2 * role.ratio * config.head_dim * 4
        return total + (config.engram_max_ngram_size - 1) * 8 + 8

    def reset_slots(self, host_slots: list[int], engram_pad: int, slots: torch.Tensor | None = None) -> None:
        """Fresh state for the sequences in host_slots, starting at position 0 (window rows need no clearing:
        positions before the start are never read). slots: the same slots as an int64 tensor on the cache's device
        (so a step resets its new sequences in a few writes, whatever their number, with no copy from the host); None
        makes it from host_slots."""
        if slots is None:
            slots = torch.tensor(host_slots, dtype=torch.int64, device=self.device)
        # index_fill_, not t[slots] = value: that copies the value to the device first, a blocking copy on CUDA
        for t in self.comp_kv_state.values():
            t.index_fill_(0, slots, 0)
        for t in self.comp_score_state.values():
            t.index_fill_(0, slots, float("-inf"))
        self.engram_history.index_fill_(0, slots, engram_pad)
        self.index_k_publisher_device.index_fill_(0, slots, -1)
        for s in host_slots:
            self.index_k_publisher[s] = -1

    @staticmethod
    def entry_rows(block_table: list[int] | torch.Tensor, entries: torch.Tensor, ratio: int) -> torch.Tensor:
        """Flat cache rows of compressed entries (int64 tensor of entry numbers) of one sequence: the one-sequence
        definition that bench_prefill's cache fill and the tests read (the model computes a step's rows with
        entry_rows.table_rows / visible_entry_rows). A tensor block_table on entries' device is not copied."""
        epb = BLOCK_SIZE // ratio
        bt = torch.as_tensor(block_table, dtype=torch.int64, device=entries.device)
        return bt[entries // epb] * epb + entries % epb
