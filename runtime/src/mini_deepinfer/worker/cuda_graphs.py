"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step launches hundreds of small kernels for a few tokens; on the GPU most of its time is launch overhead
unless the kernels are recorded once and replayed. The model's `decode_forward` has shapes that depend only on the
number of rows and the block-table width and reads no device value on the host, so a graph captured with static
input buffers computes any decode step of that many rows once the buffers hold the step's inputs.

- Buckets: a step of n sequences runs the graph of the smallest captured size >= n (default 1, 2, 4, 8, 16, 32,
  64, 96, 128, 192, 256: above 64 the eager step is host-bound, ~50-64 ms for seven layers at batch 128-256 on an
  H200 in session 44); steps with more sequences run eagerly. A graph is captured the first time its size is
  needed.
- Padding: rows n .. size-1 get token 0 at position 0 in slot 0 with an all-zero block table. Slot 0 and block 0
  are the sentinels the managers never hand out, so everything a padding row writes (window ring, compressor tail,
  entries, Engram history) lands where no sequence reads, and rows never read each other's state.
- Static buffers: input ids, positions, slots and block tables are copied into the graph's own tensors (device to
  device; the host data arrives with one non-blocking copy, as for an eager step), then the graph is replayed. The
  logits tensor is the graph's output, overwritten by the next replay of the same size: the sampler reads it first,
  on the same stream.
- All graphs share one memory pool; they run one at a time on one stream.
- No garbage collection during a capture: a dead engine in a reference cycle (its graphs with it) freed by the
  cyclic collector in the middle of another engine's capture resets its graphs there, which a capturing stream does
  not permit, and the capture fails (`cudaErrorStreamCaptureInvalidated` at the next launch). That is the likely
  cause of the two capture errors in the runtime's GPU tests (sessions 49 and 57): both in a test that builds an
  engine per prompt, each engine in a reference cycle, and the failing run printed CUDAGraph reset's "operation not
  permitted when stream is capturing". So a capture collects first and runs with the collector off.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
WARMUP_RUNS = 2  # eager runs before a capture: Triton compiles and autotunes, the allocator settles


@dataclass
class CapturedDecode:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor  # int64 [size]
    tensors: StepTensors  # positions, slots [size], block_tables [size, width], sample_rows = 0 .. size-1
    logits: torch.Tensor  # fp32 [size, vocab], written by each replay


class DecodeGraphs:
    """model: a V41Model-like module with decode_forward(input_ids, StepTensors, cache); width: the block-table
    width every decode step uses (ModelRunner: blocks for max_model_len)."""

    def __init__(self, model: torch.nn.Module, cache, device: torch.device, width: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES) -> None:
        if device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if not batch_sizes or any(b < 1 for b in batch_sizes):
            raise ValueError(f"batch sizes must be >= 1, got {batch_sizes}")
        self.model, self.cache, self.device, self.width = model, cache, device, width
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.graphs: dict[int, CapturedDecode] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def bucket(self, n: int) -> int | None:
        """The graph size that runs a step of n rows, or None (more rows than the largest size)."""
        return next((b for b in self.batch_sizes if b >= n), None)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of a decode batch whose tensors were built with this width and whose sample rows are all its
        rows in order: fp32 [n, vocab], a view of the graph's output."""
        n = len(batch.query_lens)
        size = self.bucket(n)
        if size is None:
            raise ValueError(f"no graph for {n} rows (largest {self.batch_sizes[-1]})")
        captured = self.graphs.get(size)
        if captured is None:
            captured = self.graphs[size] = self._capture(size)
        t = batch.tensors
        if t is None or t.block_tables.shape[1] != self.width:
            raise ValueError("decode batch tensors must be built with the graphs' block-table width")
        static = captured.tensors
        captured.input_ids[:n].copy_(batch.input_ids)
        static.positions[:n].copy_(t.positions)
        static.slots[:n].copy_(t.slots)
        static.block_tables[:n].copy_(t.block_tables)
        if n < size:  # padding rows: the sentinels (a previous, larger step may have left real values here)
            captured.input_ids[n:].zero_()
            static.positions[n:].zero_()
            static.slots[n:].zero_()
            static.block_tables[n:].zero_()
        captured.graph.replay()
        return captured.logits[:n]

    def _capture(self, size: int) -> CapturedDecode:
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.int64, device=self.device)  # noqa: E731
        input_ids = zeros(size)
        rows = torch.arange(size + 1, dtype=torch.int64, device=self.device)
        # decode_forward reads positions, block tables, slots and sampled rows (replay refills the first three); a
        # decode step's row_seq and query_starts are these aranges whatever its inputs, its context_lens unread
        tensors = StepTensors(zeros(size), zeros(size, self.width), zeros(size), rows[:size], rows[:size],
                              zeros(size), rows)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.model.decode_forward(input_ids, tensors, self.cache)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        gc.collect()  # dead graphs go now, not during the capture (module docstring)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.model.decode_forward(input_ids, tensors, self.cache)
        finally:
            if collecting:
                gc.enable()
        return CapturedDecode(graph, input_ids, tensors, logits)
