"""Per-request sampling and stopping parameters, validated when they are made."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it before the Gumbel noise is added.
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p (1.0 keeps all).
    top_k: keep the k most likely tokens (0 or -1 keeps all).
    max_tokens: the number of output tokens after which the request finishes with reason "length".
    seq_seed: the request's sampling seed; the same prompt, parameters and seed give the same tokens whatever the
        batch (None: the engine draws a fresh random seed for each request).
    stop_token_ids: extra token ids that finish the request with reason "stop" (the model's EOS always does,
        unless ignore_eos). A stop token is kept as the last output token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seq_seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Types first: a float seed or max_tokens, a NaN temperature or a truthy string for ignore_eos was once taken
        # and failed later inside a step, or sampled token 0 for ever, instead of being refused here.
        _require_real("temperature", self.temperature)
        _require_real("top_p", self.top_p)
        for name in ("top_k", "max_tokens"):
            _require_int(name, getattr(self, name))
        if self.seq_seed is not None:
            _require_int("seq_seed", self.seq_seed)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"SamplingParams: ignore_eos must be a bool, got {self.ignore_eos!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Iterable):
            raise TypeError(f"SamplingParams: stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        for token in self.stop_token_ids:
            _require_int("stop_token_ids", token)
        # plain Python numbers from here on (numpy / torch scalars are accepted above)
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        self.top_k, self.max_tokens = int(self.top_k), int(self.max_tokens)
        self.seq_seed = None if self.seq_seed is None else int(self.seq_seed)
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"SamplingParams: temperature must be finite and >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0:
            self.top_k = -1
        if self.top_k < -1:
            raise ValueError(f"SamplingParams: top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams: max_tokens must be >= 1, got {self.max_tokens}")
        if self.seq_seed is not None and not -(2**63) <= self.seq_seed < 2**64:
            raise ValueError(f"SamplingParams: seq_seed must fit in 64 bits, got {self.seq_seed}")
        negative = [t for t in self.stop_token_ids if t < 0]
        if negative:
            raise ValueError(f"SamplingParams: stop_token_ids must be >= 0, got {negative[0]}")


def _require_int(name: str, value: object) -> None:
    """An int (or a numpy / torch integer scalar), not a bool and not a float: TypeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"SamplingParams: {name} must be an int, got {value!r}")


def _require_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"SamplingParams: {name} must be a number, got {value!r}")
