"""Per-request sampling and stopping parameters, validated when they are made."""

from __future__ import annotations

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
        if self.temperature < 0:
            raise ValueError(f"SamplingParams: temperature must be >= 0, got {self.temperature}")
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
        self.stop_token_ids = list(self.stop_token_ids)
