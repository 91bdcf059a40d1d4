"""Which sequences run in the next step, and with how many tokens: the CPU half of the step contract.

A step is either a prefill step (FCFS admission of waiting prompts, possibly one chunk of a long prompt) or a
decode step (every running sequence advances by one token). The decision uses reservations only
(`num_cached_tokens`, `num_inflight_tokens`), never a device result, so with zero-overhead scheduling it can be
made while the previous step is still running. The output, `ScheduledStep`, is the complete description of the
step: the model runner executes exactly it and never touches the queues.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mini_deepinfer.engine.block_manager import AllocStatus, KVCacheManager
from mini_deepinfer.engine.sequence import FinishReason, Sequence, SequenceStatus


# Sequences decoded together by default (the engine's and LLM's too); 64 until session 45. A decode step streams the
# routed experts' weights once whatever the batch, so tokens per second grow with it: one H200 at the real widths,
# 32,768 tokens of context, CUDA graphs to 256 rows: batch 64 / 256 in docs/reports/runtime-decode.md, "Session 45".
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 4096  # query tokens of one step
    max_model_len: int = 4096  # prompt + output tokens of one sequence
    chunked_prefill: bool = True
    # With sequences running, a prefill step is attempted right after a prefill step (so chunks and bursts of
    # admissions run back to back) and then once every this many decode steps; DeepInfer's default is 70.
    prefill_attempt_interval: int = 70

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_model_len < 1 or self.prefill_attempt_interval < 1:
            raise ValueError("max_num_seqs, max_model_len and prefill_attempt_interval must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): a decode step computes one token per running sequence"
            )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}), or a long prompt (or a recomputation) could never run"
            )


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's part of a step. Snapshots, not references: later scheduling cannot change a step."""

    seq: Sequence
    epoch: int
    context_len: int  # tokens already cached (or reserved) before this step; 0 = start from a fresh state
    query_len: int  # tokens computed in this step
    input_token_ids: list[int]  # the query tokens known on the host ([] when `input_in_flight`)
    input_in_flight: bool  # decode whose input token is the previous step's still-unread sample
    block_table: list[int]
    state_slot: int
    sample_position: int | None  # output index sampled at the last query token; None for a non-final chunk


@dataclass
class ScheduledStep:
    is_prefill: bool
    sequences: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.query_len for s in self.sequences)

    @property
    def sampled(self) -> list[ScheduledSequence]:
        return [s for s in self.sequences if s.sample_position is not None]

    @property
    def is_empty(self) -> bool:
        return not self.sequences


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.decode_steps_since_prefill = 0
        self.num_preemptions = 0

    # ------------------------------------------------------------------ queues
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence wherever it is and release its blocks and state slot together.

        The device may still be running a step that reads them; every step is issued on one stream, so a later
        step that reuses them is ordered after it.
        """
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.lose_cache()  # also bumps the epoch: an in-flight result for it will be discarded
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    # ------------------------------------------------------------------ one step
    def schedule(self) -> ScheduledStep:
        if self.waiting and self._should_attempt_prefill():
            step = self._schedule_prefill()
            if not step.is_empty:
                self.decode_steps_since_prefill = 0
                return step
        step = self._schedule_decode()
        if not step.is_empty:
            self.decode_steps_since_prefill += 1
        return step

    def _should_attempt_prefill(self) -> bool:
        return not self.running or self.decode_steps_since_prefill % self.config.prefill_attempt_interval == 0

    def _schedule_prefill(self) -> ScheduledStep:
        """FCFS: admit waiting sequences in order, stopping at the first that does not fit (no skipping ahead)."""
        step = ScheduledStep(is_prefill=True)
        budget = self.config.max_num_batched_tokens
        num_seqs = len(self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            num_tokens = len(seq.token_ids)  # a waiting sequence has nothing in flight
            if not seq.holds_resources:  # a chunked prefill in progress already holds them
                if num_seqs >= self.config.max_num_seqs:
                    break
                status = self.kv.can_allocate(num_tokens)
                if status == AllocStatus.NEVER:
                    raise RuntimeError(
                        f"{seq.request_id}: {num_tokens} tokens can never fit the KV cache; the engine's "
                        "budget check should have refused this request"
                    )
                if status == AllocStatus.LATER:
                    break
            query_len = num_tokens - seq.num_cached_tokens
            if query_len > budget:
                if not self.config.chunked_prefill:
                    break
                query_len = budget
            if not seq.holds_resources:
                self.kv.allocate(seq, num_tokens)
            num_seqs += 1  # a continued partial prompt holds resources too
            is_last_chunk = seq.num_cached_tokens + query_len == num_tokens
            step.sequences.append(self._reserve(seq, query_len, sample=is_last_chunk))
            budget -= query_len
            if not is_last_chunk:
                break  # at most one partial prompt per step, and it is the last one; it stays at the head
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        return step

    def _schedule_decode(self) -> ScheduledStep:
        """Advance every running sequence by one token; under block pressure preempt the longest outputs."""
        step = ScheduledStep(is_prefill=False)
        # Longest output first; served from the short end, preempted from the long end (ties: later admission
        # first, since sorting is stable and the queue is popped from the end).
        queue = sorted(self.running, key=lambda s: s.num_output_tokens + s.num_inflight_tokens, reverse=True)
        served: set[int] = set()
        while queue:
            seq = queue.pop()
            if self._awaits_final_token(seq):
                continue  # its last token is in flight; scheduling more would only be discarded
            needed = seq.get_len()  # the new token's position is get_len() - 1
            while not self.kv.can_grow(seq, needed) and queue:
                self._preempt(queue.pop(0), step)
            if not self.kv.can_grow(seq, needed):
                self._preempt(seq, step)
                continue
            self.kv.grow(seq, needed)
            served.add(id(seq))
        # Step order = admission order, which keeps rows stable from step to step.
        for seq in self.running:
            if id(seq) in served:
                step.sequences.append(self._reserve(seq, 1, sample=True))
        return step

    def _awaits_final_token(self, seq: Sequence) -> bool:
        return (
            seq.num_output_tokens + seq.num_inflight_tokens >= seq.params.max_tokens
            or seq.get_len() >= self.config.max_model_len
        )

    def _reserve(self, seq: Sequence, query_len: int, sample: bool) -> ScheduledSequence:
        """Snapshot the sequence's part of the step and advance its reservations."""
        context_len = seq.num_cached_tokens
        in_flight = seq.num_inflight_tokens > 0
        if in_flight:  # decode of the token the previous step is still sampling
            assert query_len == 1 and context_len == seq.get_len() - 1, "decode is legal only at get_len() - 1"
            input_ids: list[int] = []
        else:
            input_ids = seq.token_ids[context_len : context_len + query_len]
        entry = ScheduledSequence(
            seq=seq,
            epoch=seq.epoch,
            context_len=context_len,
            query_len=query_len,
            input_token_ids=input_ids,
            input_in_flight=in_flight,
            block_table=list(seq.block_table),
            state_slot=seq.state_slot,
            sample_position=context_len + query_len - seq.num_prompt_tokens if sample else None,
        )
        seq.num_cached_tokens += query_len
        if sample:
            seq.num_inflight_tokens += 1
        return entry

    def _preempt(self, seq: Sequence, step: ScheduledStep) -> None:
        """Release both resources and requeue at the head; the recomputation prefills prompt + outputs so far."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.lose_cache()
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        step.preempted.append(seq)
        self.num_preemptions += 1
