"""The step loop: schedule step N, execute N asynchronously, process N-1.

    step N (enable_zos=True)
      CPU  schedule(N)      decisions from reservations only
      CPU  execute(N)       enqueue inputs, forward, sampling, copy-back; in-flight inputs remapped on the device
      CPU  process(N-1)     wait for N-1, append tokens, finish and free sequences
      GPU  ... N-1 ... | ... N ...

With enable_zos=False the same loop processes step N right after executing it (no overlap, no in-flight tokens
at scheduling time). Either way a result carrying a stale epoch (its sequence was preempted or aborted since) is
discarded, never written back.
"""

from __future__ import annotations

import itertools
import operator
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from mini_deepinfer.engine.block_manager import KVCacheManager
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, SchedulerConfig
from mini_deepinfer.engine.sequence import FinishReason, Sequence
from mini_deepinfer.worker.cuda_graphs import DEFAULT_BATCH_SIZES
from mini_deepinfer.worker.model_runner import CachePlan, CacheType, ModelRunner, StepHandle, plan_cache


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int = 4096
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None  # None: max(4096, max_num_seqs, max_model_len if not chunked)
    chunked_prefill: bool = True
    prefill_attempt_interval: int = 70
    enable_zos: bool = True
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float | None = None  # used on CUDA when kv_cache_memory_gb is None (default 0.9)
    record_logits: bool = False  # keep each sampled row's logits on its request (tests, comparisons)
    enforce_eager: bool = False  # no CUDA graphs for decode steps
    cuda_graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # decode buckets replayed from CUDA graphs

    def scheduler_config(self) -> SchedulerConfig:
        batched = self.max_num_batched_tokens
        if batched is None:
            batched = max(4096, self.max_num_seqs, 0 if self.chunked_prefill else self.max_model_len)
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=batched,
            max_model_len=self.max_model_len,
            chunked_prefill=self.chunked_prefill,
            prefill_attempt_interval=self.prefill_attempt_interval,
        )


@dataclass
class RequestMetrics:
    """perf_counter() timestamps of one request, in seconds."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (a stop token, when one ended the request, is the last)
    finish_reason: str  # "stop" | "length" | "abort"
    metrics: RequestMetrics
    logits: list[torch.Tensor] = field(default_factory=list)  # fp32 [vocab] per token, when recorded
    text: str | None = None  # the generated tokens decoded, filled in by LLM.generate when there is a tokenizer


def check_request(prompt_token_ids: Iterable[int], params: SamplingParams, vocab_size: int,
                  max_model_len: int) -> list[int]:
    """Raise ValueError naming the problem if the request is bad (TypeError for params that are not
    SamplingParams); returns the ids as ints. Shared by the engine and the data-parallel launcher's parent."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
    if isinstance(prompt_token_ids, torch.Tensor) and prompt_token_ids.dim() != 1:
        raise ValueError(f"a prompt is a sequence or 1-D tensor of token ids, got a {prompt_token_ids.dim()}-D tensor")
    if not isinstance(prompt_token_ids, Iterable):
        raise ValueError(f"a prompt is a sequence or 1-D tensor of token ids, got {prompt_token_ids!r}")
    items = list(prompt_token_ids)  # once: it may be a generator
    # bools pass operator.index (True is 1), so they are refused by name
    if (isinstance(prompt_token_ids, torch.Tensor) and prompt_token_ids.dtype == torch.bool
            or any(isinstance(t, bool) for t in items)):
        raise ValueError("prompt token ids must be integers, not bools")
    try:
        tokens = [operator.index(t) for t in items]
    except TypeError:
        raise ValueError("prompt token ids must be integers") from None
    if not tokens:
        raise ValueError("empty prompt: a request needs at least one token")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range [0, {vocab_size})")
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"stop token id {bad[0]} is out of range [0, {vocab_size})")
    if len(tokens) > max_model_len:
        raise ValueError(f"prompt of {len(tokens)} tokens is longer than max_model_len={max_model_len}")
    return tokens


class LLMEngine:
    """Requests in, finished RequestOutputs out of `step()`.

    model: a module with `.config` (vocab_size, eos_token_id) and `forward(ForwardBatch, cache) -> fp32 logits
    [len(sample_rows), vocab]`; cache_cls: its cache (V41Cache), sized here from the budget.
    """

    def __init__(self, model: torch.nn.Module, cache_cls: type[CacheType], config: EngineConfig,
                 device: torch.device | str) -> None:
        self.config = config
        self.device = torch.device(device)
        self.model_config = model.config
        sched_config = config.scheduler_config()
        gpu_util = config.gpu_memory_utilization
        if config.kv_cache_memory_gb is None and gpu_util is None:
            gpu_util = 0.9
        self.cache_plan: CachePlan = plan_cache(
            model.config,
            cache_cls,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            device=self.device,
            kv_cache_memory_gb=config.kv_cache_memory_gb,
            gpu_memory_utilization=gpu_util,
        )
        cache = cache_cls(model.config, self.cache_plan.num_blocks, self.cache_plan.num_slots, self.device)
        self.scheduler = Scheduler(sched_config, KVCacheManager(self.cache_plan.num_blocks, self.cache_plan.num_slots))
        self.runner = ModelRunner(model, cache, self.device, record_logits=config.record_logits,
                                  max_model_len=config.max_model_len, enforce_eager=config.enforce_eager,
                                  cuda_graph_batch_sizes=config.cuda_graph_batch_sizes)
        self._requests: dict[str, Sequence] = {}  # unfinished requests
        self._in_flight: StepHandle | None = None
        self._aborted: list[RequestOutput] = []
        self._ids = itertools.count()
        self.num_steps = 0

    # ------------------------------------------------------------------ requests
    def check_request(self, prompt_token_ids: Iterable[int], params: SamplingParams) -> list[int]:
        """Raise ValueError naming the problem if the request is bad; changes nothing. Returns the ids as ints."""
        return check_request(prompt_token_ids, params, self.model_config.vocab_size, self.config.max_model_len)

    def add_request(self, prompt_token_ids: Iterable[int], params: SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request (token ids: a list or 1-D tensor of ints); returns its id."""
        prompt_token_ids = self.check_request(prompt_token_ids, params)
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running")
        seed = params.seq_seed if params.seq_seed is not None else secrets.randbits(63)
        seq = Sequence(request_id, prompt_token_ids, params, seed)
        self._requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Cancel a request; harmless for an unknown or already finished id.

        Its blocks and slot are freed now (a step still reading them finishes first: one stream), its epoch moves
        so an in-flight result for it is dropped, and its output (reason "abort") comes out of the next step().
        """
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.finish(seq, FinishReason.ABORT)
        seq.finish_time = time.perf_counter()
        self._aborted.append(self._output(seq))

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or self._in_flight is not None or bool(self._aborted)

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one engine iteration; return the requests that finished in it."""
        step = self.scheduler.schedule()
        now = time.perf_counter()
        handle = None
        if not step.is_empty:
            for s in step.sequences:
                if s.seq.first_scheduled_time is None:
                    s.seq.first_scheduled_time = now
            handle = self.runner.execute(step, self._in_flight)
        joined_peers = step.is_empty and self._join_peers_step()
        finished, self._aborted = self._aborted, []
        processed = self._in_flight is not None
        if self._in_flight is not None:
            finished += self._process(self._in_flight)
        self._in_flight = handle
        if not self.config.enable_zos and handle is not None:
            finished += self._process(handle)
            self._in_flight = None
            processed = True
        if step.is_empty and not joined_peers and not step.preempted and not processed and not finished \
                and self._requests:
            raise RuntimeError("engine made no progress: nothing could be scheduled and nothing is in flight")
        self.num_steps += 1
        return finished

    def _join_peers_step(self) -> bool:
        """Called for an empty step. A data-parallel rank (distributed/data_parallel.py) runs a dummy forward here
        when another rank has work, so that the ranks' collectives pair up; returns whether it did. Alone: never."""
        return False

    def _process(self, handle: StepHandle) -> list[RequestOutput]:
        tokens, logits = handle.wait()
        now = time.perf_counter()
        finished = []
        for row, (s, token) in enumerate(zip(handle.sampled, tokens)):
            seq = s.seq
            if seq.epoch != s.epoch or seq.is_finished:
                continue  # preempted or aborted since this step was scheduled
            seq.num_inflight_tokens -= 1
            seq.token_ids.append(token)
            if logits is not None:
                seq.output_logits.append(logits[row].clone())
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                seq.finish_time = now
                del self._requests[seq.request_id]
                finished.append(self._output(seq))
        return finished

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.params
        if (not p.ignore_eos and token == self.model_config.eos_token_id) or token in p.stop_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or len(seq.token_ids) >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    @staticmethod
    def _output(seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason.value,
            metrics=RequestMetrics(seq.arrival_time, seq.first_scheduled_time, seq.first_token_time, seq.finish_time),
            logits=seq.output_logits,
        )
