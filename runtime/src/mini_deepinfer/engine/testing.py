"""A stand-in model for engine tests: cheap, exact, and sensitive to every kind of state-handling bug.

`FakePagedModel` has the V41Model interface (`config`, `forward(ForwardBatch, cache) -> fp32 logits`). It stores
every token it computes in its own paged cache (one int64 per position, in the block the batch's table names) and
folds it into a running hash in the sequence's state slot, resetting the slot when context_len == 0. The logits of
a row are a pseudo-random vector keyed on three things read back from that state: the hash of the tokens in the
pages, the slot's running hash and the slot's token count. For a correct engine they are all functions of the
token prefix, so `fake_logits(prefix)` is the exact, sequential oracle; a wrong block table, a reused slot that was
not reset, a lost or duplicated token, a wrong ZOS remap or a stale page changes the key and so the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_deepinfer.engine.block_manager import BLOCK_SIZE
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.sequence import to_int64
from mini_deepinfer.layers.sampler import SamplingBatch, sample
from mini_deepinfer.worker.forward_batch import ForwardBatch

_MOD = (1 << 61) - 1


def _fold(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 1) % _MOD


def _key(page_hash: int, slot_hash: int, count: int) -> int:
    return (page_hash * 31 + slot_hash * 17 + count) % _MOD


@dataclass(frozen=True)
class FakeConfig:
    vocab_size: int = 512
    eos_token_id: int = 1


def _logits_for_key(key: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(key)
    return torch.randn(vocab, generator=g, dtype=torch.float32) * 3.0


def fake_logits(prefix: list[int], config: FakeConfig) -> torch.Tensor:
    """The oracle: the logits a correct engine gets for the last token of `prefix`."""
    h = 0
    for t in prefix:
        h = _fold(h, t)
    return _logits_for_key(_key(h, h, len(prefix)), config.vocab_size)


class FakePagedCache:
    def __init__(self, config: FakeConfig, num_blocks: int, num_slots: int, device: torch.device | str) -> None:
        self.tokens = torch.full((num_blocks, BLOCK_SIZE), -1, dtype=torch.int64, device=device)
        self.slot_count = [0] * num_slots
        self.slot_hash = [0] * num_slots

    @staticmethod
    def bytes_per_block(config: FakeConfig) -> int:
        return BLOCK_SIZE * 8

    @staticmethod
    def bytes_per_slot(config: FakeConfig) -> int:
        return 16


class FakePagedModel(torch.nn.Module):
    def __init__(self, config: FakeConfig | None = None) -> None:
        super().__init__()
        self.config = config or FakeConfig()

    def forward(self, batch: ForwardBatch, cache: FakePagedCache) -> torch.Tensor:
        batch.validate(BLOCK_SIZE)
        ids = batch.input_ids.tolist()
        row_keys: dict[int, int] = {}
        row = 0
        for q, ctx, table, slot in zip(batch.query_lens, batch.context_lens, batch.block_tables, batch.slots):
            if ctx == 0:
                cache.slot_count[slot], cache.slot_hash[slot] = 0, 0
            for j in range(q):
                pos = ctx + j
                cache.tokens[table[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = ids[row]
                cache.slot_hash[slot] = _fold(cache.slot_hash[slot], ids[row])
                cache.slot_count[slot] += 1
                if row in batch.sample_rows:
                    pages = cache.tokens[table[: pos // BLOCK_SIZE + 1]].flatten()[: pos + 1].tolist()
                    page_hash = 0
                    for t in pages:
                        page_hash = _fold(page_hash, t)
                    row_keys[row] = _key(page_hash, cache.slot_hash[slot], cache.slot_count[slot])
                row += 1
        logits = [_logits_for_key(row_keys[r], self.config.vocab_size) for r in batch.sample_rows]
        device = batch.input_ids.device
        if not logits:
            return torch.empty(0, self.config.vocab_size, device=device)
        return torch.stack(logits).to(device)


def fake_generate(
    prompt: list[int], params: SamplingParams, seed: int, config: FakeConfig, max_model_len: int
) -> tuple[list[int], str, list[torch.Tensor]]:
    """The oracle run of one request, alone and sequentially: (output tokens, finish reason, logits per token)."""
    tokens, out, logits_seen = list(prompt), [], []
    while True:
        logits = fake_logits(tokens, config)
        batch = SamplingBatch.build(
            [params.temperature], [params.top_k], [params.top_p], [to_int64(seed)], [len(out)], "cpu"
        )
        token = int(sample(logits[None], batch)[0])
        out.append(token)
        tokens.append(token)
        logits_seen.append(logits)
        if (not params.ignore_eos and token == config.eos_token_id) or token in params.stop_token_ids:
            return out, "stop", logits_seen
        if len(out) >= params.max_tokens or len(tokens) >= max_model_len:
            return out, "length", logits_seen


def compare_generations(got: list, want: list, params: list[SamplingParams], atol: float) -> float:
    """Check two runs of the same requests whose logits may differ by rounding (other kernels, batch splits or
    GPUs) and return the largest |logit difference| seen. `got` / `want`: outputs with `token_ids` and recorded
    `logits` (one fp32 [vocab] tensor per generated token).

    Each request is compared step by step while its tokens agree: the logits must be within `atol`. The tiny random
    model's logits are flat, so a rounding-level difference can flip a near-tie; a greedy request may therefore
    diverge only at a step where `want`'s two best logits are within 2 * atol, and the comparison of that request
    stops there (later steps see different prefixes). A sampled request (temperature > 0) may diverge at any step
    whose logits agreed: its Gumbel-perturbed scores can be as close as the logits allow; it stops there too."""
    worst = 0.0
    for i, (g, w, p) in enumerate(zip(got, want, params, strict=True)):
        for step, (lg, lw) in enumerate(zip(g.logits, w.logits, strict=True)):
            diff = float((lg.float().cpu() - lw.float().cpu()).abs().max())
            worst = max(worst, diff)
            assert diff <= atol, f"request {i} step {step}: logits differ by {diff:.4g} > {atol}"
            if g.token_ids[step] != w.token_ids[step]:
                if p.temperature == 0.0:
                    top2 = lw.float().topk(2).values
                    gap = float(top2[0] - top2[1])
                    assert gap <= 2 * atol, f"request {i} step {step}: greedy tokens differ, top-2 gap {gap:.4g}"
                break
    return worst
