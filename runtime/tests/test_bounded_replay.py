"""Bounded replay of the prefill (V41Model.prefill_keep_tokens) against full replay and the reference, on CPU.

The claim under test (bounded_replay.py): past the boundary layer (the tiny model's layer 4: last kv source and
candidate source) each consumer layer's window widens the cone of positions the last token depends on by W-1, so
with c consumer layers bounded replay is exact iff keep >= c*(W-1)+1 (tiny: 3 * 127 + 1 = 382), the rings the next
step reads need keep >= c*(W-1) (381), and anything shorter, like the official engine's 140 = window + 12, is an
approximation. Metric: bit-for-bit equality with the same engine model's full-replay prefill (one sequence, so the
consumer layers' row count is the only difference and, on CPU, changes no rounding here); against the reference,
the project's tolerance for a request run alone (0.05 max |logit difference|).
Run with -s for the deviation numbers (docs/reports/prefill-bounded-replay.md records them).
"""

from __future__ import annotations

import copy

import pytest
import torch
from mini_flashmla.cache_layout import pack_window_fp8

from mini_deepinfer.models.deepseek_v41 import load_model, load_reference
from mini_deepinfer.models.deepseek_v41.bounded_replay import (
    consumer_layer_ids,
    exact_keep_tokens,
    prefill_boundary_layer,
)
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.config import V41Config
from mini_deepinfer.worker.forward_batch import ForwardBatch

PROMPT = 400  # > the tiny model's exact bound (382), so even the bound drops rows
DECODE_STEPS = 3
TABLE = [3, 1, 4, 5]  # 4 blocks of 128 positions, out of order: paging stays in play
SLOT = 1
TOLERANCE = 0.05  # engine vs reference, one request alone (integration_tests/test_engine_vs_reference.py)


@pytest.fixture(scope="module")
def model():
    return load_model("tiny", "cpu")


@pytest.fixture(scope="module")
def prompt(model):
    g = torch.Generator().manual_seed(23)
    return torch.randint(3, model.config.vocab_size, (PROMPT,), generator=g)


def prefill_then_decode(model, keep: int | None, prompt: torch.Tensor, tokens: list[int] | None = None,
                        cache: V41Cache | None = None):
    """Prefill (one step) then DECODE_STEPS decode steps on `tokens` (greedy when None). Returns (fp32 logits
    [1 + DECODE_STEPS, vocab], the decoded tokens, the cache right after the prefill, the cache at the end)."""
    model.prefill_keep_tokens = keep
    cache = cache or V41Cache(model.config, num_blocks=6, num_slots=2)
    n = len(prompt)
    out = [model(ForwardBatch(prompt, [n], [0], [TABLE], [SLOT], [n - 1]), cache)[0]]
    after_prefill = copy.deepcopy(cache)
    tokens = list(tokens) if tokens is not None else []
    for i in range(DECODE_STEPS):
        if len(tokens) <= i:
            tokens.append(int(out[-1].argmax()))
        out.append(model(ForwardBatch(torch.tensor([tokens[i]]), [1], [n + i], [TABLE], [SLOT], [0]), cache)[0])
    model.prefill_keep_tokens = None
    return torch.stack(out), tokens, after_prefill, cache


@pytest.fixture(scope="module")
def full_replay(model, prompt):
    return prefill_then_decode(model, None, prompt)


def slot_state_equal(a: V41Cache, b: V41Cache) -> dict[str, bool]:
    """Per state tensor: equal bit for bit on SLOT's rows and TABLE's blocks (what the sequence owns)."""
    own_ring = slice(SLOT * a.cfg.sliding_window, (SLOT + 1) * a.cfg.sliding_window)
    res = {}
    for lid in a.window:
        res[f"window[{lid}]"] = torch.equal(a.window[lid][own_ring], b.window[lid][own_ring])
    for name in ("compressed_kv", "index_k"):
        for lid, rows in getattr(a, name).items():
            epb = rows.shape[0] // a.num_blocks
            own = torch.cat([torch.arange(blk * epb, (blk + 1) * epb) for blk in TABLE])
            res[f"{name}[{lid}]"] = torch.equal(rows[own], getattr(b, name)[lid][own])
    for name in ("comp_kv_state", "comp_score_state"):
        for lid, st in getattr(a, name).items():
            res[f"{name}[{lid}]"] = torch.equal(st[SLOT], getattr(b, name)[lid][SLOT])
    return res


def deviation(got: torch.Tensor, want: torch.Tensor) -> str:
    diff = (got - want).abs().amax(-1)
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    return (f"max |logit diff| per step {[round(float(d), 4) for d in diff]}, "
            f"cosine {[round(float(c), 5) for c in cos]}")


def test_boundary_and_exact_bound_follow_the_layer_roles(model):
    assert prefill_boundary_layer(model.config) == 4
    assert consumer_layer_ids(model.config) == [5, 6, 7]
    assert exact_keep_tokens(model.config) == 3 * 127 + 1
    real = V41Config()
    assert prefill_boundary_layer(real) == 20
    assert exact_keep_tokens(real) == 19 * 127 + 1 == 2414


def test_keep_at_the_bound_equals_full_replay_bit_for_bit(model, prompt, full_replay):
    want, tokens, want_prefilled, want_end = full_replay
    keep = exact_keep_tokens(model.config)
    model.capture = []
    try:
        got, got_tokens, got_prefilled, got_end = prefill_then_decode(model, keep, prompt)
        rows = [c.shape[0] for c in model.capture[: 8]]
    finally:
        model.capture = None
    # layers 0..4 ran every row, the consumers only the kept ones
    assert rows == [PROMPT] * 5 + [keep] * 3
    assert torch.equal(got, want), deviation(got, want)
    assert got_tokens == tokens
    for when, a, b in [("after the prefill", got_prefilled, want_prefilled), ("at the end", got_end, want_end)]:
        differ = [k for k, same in slot_state_equal(a, b).items() if not same]
        assert not differ, f"{when}: {differ}"
    ref = load_reference("tiny", "cpu")
    st = ref.new_state()
    ref_logits = [ref.forward(prompt, 0, st)[-1]]
    for i, tok in enumerate(tokens):
        ref_logits.append(ref.forward(torch.tensor([tok]), PROMPT + i, st)[-1])
    ref_logits = torch.stack(ref_logits)
    worst = float((got - ref_logits).abs().max())
    print(f"\n[bounded replay, keep {keep}] vs full replay: bit-identical; vs reference: {deviation(got, ref_logits)}")
    assert worst < TOLERANCE


@pytest.mark.parametrize("keep", [381, 140])
def test_keep_below_the_bound_is_an_approximation(model, prompt, full_replay, keep):
    """381 = c*(W-1): the last prefill position is off (its cone loses one position) but the rings the decode steps
    read are exact, so they are bit-identical; 140 (the official engine's window + 12) loses more."""
    want, tokens, want_prefilled, _ = full_replay
    got, _, got_prefilled, _ = prefill_then_decode(model, keep, prompt, tokens)
    print(f"\n[bounded replay, keep {keep}] vs full replay: {deviation(got, want)}, greedy tokens equal: "
          f"{(got.argmax(-1) == want.argmax(-1)).tolist()}")
    assert not torch.equal(got[0], want[0])
    W, c = model.config.sliding_window, len(consumer_layer_ids(model.config))
    if keep >= c * (W - 1):
        assert torch.equal(got[1:], want[1:])
    else:
        assert all(not torch.equal(got[i], want[i]) for i in range(1, DECODE_STEPS + 1))
    # the layers up to the boundary are untouched by the keep
    differ = [k for k, same in slot_state_equal(got_prefilled, want_prefilled).items() if not same]
    assert all(k.startswith("window[") and int(k[7:-1]) in consumer_layer_ids(model.config) for k in differ), differ


def _overwrite_rings(model, cache: V41Cache, positions: range) -> None:
    """Other, random (finite) window rows in the consumer layers' ring rows of `positions`: what stale rows of
    another position look like (rows a bounded step must not read)."""
    g = torch.Generator().manual_seed(5)
    W = model.config.sliding_window
    rows = torch.tensor([SLOT * W + p % W for p in positions])
    for lid in consumer_layer_ids(model.config):
        kv = 4 * torch.randn(len(rows), model.config.head_dim, generator=g)
        cache.window[lid][rows] = pack_window_fp8(kv.to(torch.bfloat16))


def test_chunked_prefill_with_a_decode_row_keep_per_chunk_is_exact_and_reads_no_stale_ring_row(model):
    """keep applies to every prefill chunk: a chunk hands the next one only the consumer rings (exact when
    keep >= c*(W-1)) and the boundary's state (full), so every chunk may drop rows. Chunks of 420 and 390 tokens
    with keep 382 drop 38 and 8 rows; in the second chunk the first kept rows read ring rows of the first chunk
    and must skip the 8 dropped positions, whose ring rows hold other positions' data: those rows (and, in the
    first chunk, the rows of the dropped positions) are overwritten with other window rows first, which must
    change nothing. A decode row of a second sequence rides along in the second step and stays whole."""
    cfg = model.config
    keep = exact_keep_tokens(cfg)
    g = torch.Generator().manual_seed(31)
    chunks = [420, 390]
    seq = torch.randint(3, cfg.vocab_size, (sum(chunks) + DECODE_STEPS,), generator=g)
    other = torch.randint(3, cfg.vocab_size, (38,), generator=g)  # 37-token prompt + one decode token
    table, other_table, other_slot = [2, 5, 1, 7, 3, 6, 8], [4], 2  # slot 0 is the sentinel

    def run(keep_tokens: int | None, corrupt: bool):
        cache = V41Cache(cfg, num_blocks=9, num_slots=3)
        model.prefill_keep_tokens = None
        model(ForwardBatch(other[:37], [37], [0], [other_table], [other_slot], [36]), cache)
        model.prefill_keep_tokens = keep_tokens
        captured, out = [], []
        if corrupt:
            _overwrite_rings(model, cache, range(0, chunks[0] - keep))
        model.capture = []
        out.append(model(ForwardBatch(seq[: chunks[0]], [chunks[0]], [0], [table], [SLOT], [chunks[0] - 1]),
                         cache))
        captured.append(model.capture)
        if corrupt:
            _overwrite_rings(model, cache, range(chunks[0], sum(chunks) - keep))
        model.capture = []
        ids = torch.cat([other[37:], seq[chunks[0]: sum(chunks)]])
        out.append(model(ForwardBatch(ids, [1, chunks[1]], [37, chunks[0]], [other_table, table],
                                      [other_slot, SLOT], [0, chunks[1]]), cache))
        captured.append(model.capture)
        model.capture = None
        n = sum(chunks)
        for i in range(DECODE_STEPS):
            out.append(model(ForwardBatch(seq[n + i: n + i + 1], [1], [n + i], [table], [SLOT], [0]), cache))
        model.prefill_keep_tokens = None
        return torch.cat(out), captured

    try:
        full, _ = run(None, False)
        clean, clean_captured = run(keep, False)
        dirty, dirty_captured = run(keep, True)
    finally:
        model.capture = None
        model.prefill_keep_tokens = None
    assert torch.equal(clean, full), deviation(clean, full)
    for step, (a, b) in enumerate(zip(clean_captured, dirty_captured)):
        for lid, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"step {step}, layer {lid}: a stale ring row was read"
    assert [c.shape[0] for c in clean_captured[1]] == [1 + chunks[1]] * 5 + [1 + keep] * 3
    print(f"\n[bounded replay, keep {keep}, chunks {chunks} + a decode row] vs full replay: bit-identical")


def test_keep_must_cover_a_window_and_sampled_rows_must_be_kept(model, prompt):
    with pytest.raises(ValueError, match="sliding_window"):
        model.prefill_keep_tokens = model.config.sliding_window - 1
    model.prefill_keep_tokens = 200
    try:
        cache = V41Cache(model.config, num_blocks=6, num_slots=2)
        with pytest.raises(ValueError, match="sampled row 10"):
            model(ForwardBatch(prompt, [PROMPT], [0], [TABLE], [SLOT], [10, PROMPT - 1]), cache)
    finally:
        model.prefill_keep_tokens = None
