"""One request as the engine tracks it: its tokens, its two lengths under ZOS, its resources and its epoch."""

from __future__ import annotations

import enum
import time

import torch

from mini_deepinfer.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not started, preempted, or mid chunked prefill (then it already holds its resources)
    RUNNING = "running"  # prompt fully prefilled; advances one token per decode step
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS (unless ignore_eos) or one of stop_token_ids
    LENGTH = "length"  # max_tokens output tokens, or max_model_len tokens in all
    ABORT = "abort"  # LLMEngine.abort_request


def to_int64(seed: int) -> int:
    """A 64-bit seed as the signed int64 with the same bits (what torch tensors and the Triton kernel hold)."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


class Sequence:
    """A request's state.

    Two lengths (the step contract): the host knows `len(token_ids)`; the device may already be computing one more
    token per scheduled-but-unprocessed step, so `get_len() = len(token_ids) + num_inflight_tokens`.
    `num_cached_tokens` is a reservation: it advances when a step is *scheduled*, not when it finishes, so decode is
    legal exactly when `num_cached_tokens == get_len() - 1` (everything but the newest token is, or will be, cached).
    `epoch` changes whenever the sequence loses its cache (preemption, abort); a step result tagged with an older
    epoch belongs to a computation that no longer exists and is discarded.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, seed: int) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.seed = to_int64(seed)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_cached_tokens = 0
        self.num_inflight_tokens = 0
        self.epoch = 0
        self.block_table: list[int] = []
        self.state_slot = 0  # 0 is the sentinel: no slot held
        self.arrival_time = time.perf_counter()
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.output_logits: list[torch.Tensor] = []  # filled only when the engine records logits (tests)

    # ------------------------------------------------------------------ lengths
    def get_len(self) -> int:
        return len(self.token_ids) + self.num_inflight_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def holds_resources(self) -> bool:
        return self.state_slot != 0

    def lose_cache(self) -> None:
        """Forget every reservation: the cache and any in-flight result are gone (preemption or abort)."""
        self.num_cached_tokens = 0
        self.num_inflight_tokens = 0
        self.epoch += 1
