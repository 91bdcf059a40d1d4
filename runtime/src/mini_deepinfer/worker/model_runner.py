"""The device half of the step contract: turn a ScheduledStep into a ForwardBatch, run it, sample, copy back.

`execute` only enqueues work: inputs go to the device with non-blocking copies, an in-flight input token (ZOS)
is gathered on the device from the previous step's sampled-token buffer (the remap), and the sampled tokens are
copied back into pinned host memory behind a CUDA event. `StepHandle.wait()` is the only place that reads a
device result. Every step runs on the current stream, so a block or slot that the CPU frees and hands to another
sequence is not written before the step that still reads it has finished.

The device copies of the step's structure (StepTensors: positions, block tables, slots, sampled rows) are made here,
before the forward, so the forward itself has nothing to copy. Decode steps use one block-table width (blocks for
max_model_len), so all decode steps of n sequences have the same shapes; on CUDA they replay a CUDA graph of the
smallest bucket >= n (worker/cuda_graphs.py) unless `enforce_eager`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from mini_deepinfer.engine.block_manager import blocks_for
from mini_deepinfer.engine.scheduler import ScheduledSequence, ScheduledStep
from mini_deepinfer.layers.sampler import SamplingBatch, sample
from mini_deepinfer.worker.cuda_graphs import DEFAULT_BATCH_SIZES, DecodeGraphs
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors, host_to_device


class CacheType(Protocol):
    """What the runner needs of a cache class (V41Cache, or a test double)."""

    def __init__(self, config, num_blocks: int, num_slots: int, device: torch.device) -> None: ...

    @staticmethod
    def bytes_per_block(config) -> int: ...

    @staticmethod
    def bytes_per_slot(config) -> int: ...


@dataclass(frozen=True)
class CachePlan:
    num_blocks: int  # including the sentinel block 0
    num_slots: int  # including the sentinel slot 0
    bytes: int


def plan_cache(
    config,
    cache_cls: type[CacheType],
    *,
    max_num_seqs: int,
    max_model_len: int,
    device: torch.device,
    kv_cache_memory_gb: float | None,
    gpu_memory_utilization: float | None,
) -> CachePlan:
    """Size the cache from a budget: absolute GiB, or a fraction of the device's free memory (CUDA only).

    One state slot per sequence that can hold resources (max_num_seqs) plus the sentinel; the rest of the budget
    goes to blocks, capped at what max_num_seqs sequences of max_model_len tokens could ever use.
    """
    if kv_cache_memory_gb is not None and gpu_memory_utilization is not None:
        raise ValueError("give kv_cache_memory_gb or gpu_memory_utilization, not both")
    if kv_cache_memory_gb is not None:
        if kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {kv_cache_memory_gb}")
        budget = int(kv_cache_memory_gb * 2**30)
        source = "kv_cache_memory_gb"
    else:
        if device.type != "cuda":
            raise ValueError("gpu_memory_utilization needs a CUDA device; on CPU give kv_cache_memory_gb")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        free, total = torch.cuda.mem_get_info(device)
        budget = int(free * gpu_memory_utilization)
        source = (f"gpu_memory_utilization={gpu_memory_utilization} x {free / 2**30:.4f} GiB free of "
                  f"{total / 2**30:.2f} GiB on {device} with the model loaded")
    num_slots = max_num_seqs + 1
    block_bytes = cache_cls.bytes_per_block(config)
    slot_bytes = cache_cls.bytes_per_slot(config) * num_slots
    blocks_per_seq = blocks_for(max_model_len)
    most = max_num_seqs * blocks_per_seq + 1
    # 0-byte blocks (no layer keeps paged state: window-only layers) are ids only: take the most
    fit = 0 if budget < slot_bytes else (budget - slot_bytes) // block_bytes if block_bytes else most
    num_blocks = int(min(fit, most))
    if num_blocks < blocks_per_seq + 1:
        need = slot_bytes + (blocks_per_seq + 1) * block_bytes
        raise ValueError(
            f"KV cache budget of {budget / 2**30:.4f} GiB ({source}) is too small: one sequence of max_model_len="
            f"{max_model_len} tokens needs {blocks_per_seq} blocks of {block_bytes} B (+ the sentinel block) and "
            f"{num_slots} state slots of {cache_cls.bytes_per_slot(config)} B, {need / 2**30:.4f} GiB in all"
        )
    return CachePlan(num_blocks, num_slots, slot_bytes + num_blocks * block_bytes)


def check_weights_fit(folder: str | Path, device: torch.device) -> int:
    """Before loading a checkpoint on CUDA: raise ValueError naming the numbers when its weight files alone exceed
    the device's free memory (a clear message instead of an out-of-memory error halfway through the load).
    Returns the weight bytes (the *.safetensors files; the model adds a few derived tensors on top)."""
    weight_bytes = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if weight_bytes > free:
            raise ValueError(
                f"the model does not fit: its weights need {weight_bytes / 2**30:.2f} GiB, {device} has "
                f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB (and the KV cache comes on top)")
    return weight_bytes


class StepHandle:
    """A step in flight: its sampled tokens on the device, and their host copy once `wait()` returns."""

    def __init__(
        self,
        sampled: list[ScheduledSequence],
        tokens: torch.Tensor,
        logits: torch.Tensor | None,
    ) -> None:
        self.sampled = sampled
        self.tokens = tokens  # int64 [R] on the device: the next step's remap reads it there
        self.row_of = {s.seq.request_id: row for row, s in enumerate(sampled)}
        pin = tokens.is_cuda
        self._tokens_host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=pin)
        self._tokens_host.copy_(tokens, non_blocking=True)
        self._logits_host = None
        if logits is not None:
            self._logits_host = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=pin)
            self._logits_host.copy_(logits, non_blocking=True)
        self._done = None
        if pin:
            self._done = torch.cuda.Event()
            self._done.record()

    def wait(self) -> tuple[list[int], torch.Tensor | None]:
        """Block until the step is done; return its sampled tokens (and logits when recorded) on the host."""
        if self._done is not None:
            self._done.synchronize()
        return self._tokens_host.tolist(), self._logits_host


class ModelRunner:
    """max_model_len: fixes the decode steps' block-table width (None: each step's longest table).
    cuda_graph_batch_sizes: decode buckets replayed from CUDA graphs when the device is CUDA, the model offers a
    capturable `decode_forward` (`cuda_graph_decode`) and max_model_len is given; () or enforce_eager: none."""

    def __init__(self, model: torch.nn.Module, cache, device: torch.device, record_logits: bool = False,
                 max_model_len: int | None = None, enforce_eager: bool = False,
                 cuda_graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        self.record_logits = record_logits
        self.decode_width = blocks_for(max_model_len) if max_model_len is not None else None
        self.graphs: DecodeGraphs | None = None
        if (device.type == "cuda" and not enforce_eager and cuda_graph_batch_sizes and self.decode_width
                and getattr(model, "cuda_graph_decode", False)):
            self.graphs = DecodeGraphs(model, cache, device, self.decode_width, cuda_graph_batch_sizes)

    def execute(self, step: ScheduledStep, prev: StepHandle | None) -> StepHandle:
        """Enqueue the step's forward and sampling; returns at once (no device read)."""
        host_ids: list[int] = []
        remap_dst: list[int] = []
        remap_src: list[int] = []
        sample_rows: list[int] = []
        for s in step.sequences:
            if s.input_in_flight:
                if prev is None or s.seq.request_id not in prev.row_of:
                    raise RuntimeError(f"{s.seq.request_id}: input token in flight but not in the previous step")
                remap_dst.append(len(host_ids))
                remap_src.append(prev.row_of[s.seq.request_id])
                host_ids.append(0)  # placeholder, overwritten on the device below
            else:
                host_ids.extend(s.input_token_ids)
            if s.sample_position is not None:
                sample_rows.append(len(host_ids) - 1)
        input_ids = host_to_device(host_ids, torch.int64, self.device)
        if remap_dst:  # ZOS: the previous step's samples never visit the host on their way back in
            gathered = prev.tokens.index_select(0, host_to_device(remap_src, torch.int64, self.device))
            input_ids.index_copy_(0, host_to_device(remap_dst, torch.int64, self.device), gathered)
        batch = ForwardBatch(
            input_ids=input_ids,
            query_lens=[s.query_len for s in step.sequences],
            context_lens=[s.context_len for s in step.sequences],
            block_tables=[s.block_table for s in step.sequences],
            slots=[s.state_slot for s in step.sequences],
            sample_rows=sample_rows,
        )
        decode = batch.is_decode and self.decode_width is not None and all(
            len(t) <= self.decode_width for t in batch.block_tables)
        batch.tensors = StepTensors.build(batch, self.device, self.decode_width if decode else None)
        sampled = step.sampled
        with torch.inference_mode():
            if decode and self._graph_runs(batch):
                logits = self.graphs.run(batch)
                self.model.after_decode(batch.slots, self.cache)
            else:
                logits = self.model(batch, self.cache)
            params = [s.seq.params for s in sampled]
            sampling = SamplingBatch.build(
                temperatures=[p.temperature for p in params],
                top_k=[p.top_k for p in params],
                top_p=[p.top_p for p in params],
                seeds=[s.seq.seed for s in sampled],
                positions=[s.sample_position for s in sampled],
                device=self.device,
            )
            tokens = sample(logits, sampling)
        return StepHandle(sampled, tokens, logits if self.record_logits else None)

    def _graph_runs(self, batch: ForwardBatch) -> bool:
        """Host-only checks that a decode batch can replay a graph: a bucket holds it, it samples every row in
        order, and the model's decode path applies to its slots."""
        n = len(batch.query_lens)
        return (self.graphs is not None and self.graphs.bucket(n) is not None
                and batch.sample_rows == list(range(n)) and self.model.decode_ready(batch.slots, self.cache))
