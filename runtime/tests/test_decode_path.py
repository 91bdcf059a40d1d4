"""The fixed-shape decode path (V41Model.decode_forward) against the general forward, on CPU.

decode_forward is what the runner captures in CUDA graphs, so its shapes may depend only on the number of rows and
the block-table width. These tests check that it computes what the general path computes (bit for bit: same ops,
same rows), at positions where ratio-2 groups close and where they do not (the spec 2.4 publisher differs), for
several block-table widths (the padding of the indexer's key list), and that padding rows (token 0, position 0,
slot 0, block table of zeros) write only the sentinels: every other slot and block is left as it was.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from mini_deepinfer.models.deepseek_v41 import load_model
from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE, V41Cache
from mini_deepinfer.models.deepseek_v41.config import tiny_config
from mini_deepinfer.models.deepseek_v41.model import _decode_publisher_plan
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

CPU = torch.device("cpu")
PROMPT_LENS = (37, 126, 130)  # decode positions on both sides of a block boundary and of ratio-2 groups


@pytest.fixture(scope="module")
def prefilled():
    """The tiny model and a cache holding three prefilled sequences (slots 1-3, two blocks each), with their
    token lists (prompt + a few more tokens to decode)."""
    model = load_model("tiny-random/deepseek-v4.1-flash-1017", "cpu")
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(3, model.config.vocab_size, (n + 4,), generator=g).tolist() for n in PROMPT_LENS]
    tables = [[1 + 2 * i, 2 + 2 * i] for i in range(len(seqs))]
    cache = V41Cache(model.config, 2 * len(seqs) + 1, len(seqs) + 1, "cpu")
    n = list(PROMPT_LENS)
    batch = ForwardBatch(torch.tensor([t for s, k in zip(seqs, n) for t in s[:k]]), n, [0] * len(n), tables,
                         [1, 2, 3], [sum(n[: i + 1]) - 1 for i in range(len(n))])
    model(batch, cache)
    return model, cache, seqs, tables


def decode_batch(seqs, tables, step: int) -> ForwardBatch:
    pos = [n + step for n in PROMPT_LENS]
    return ForwardBatch(torch.tensor([s[p] for s, p in zip(seqs, pos)]), [1] * len(seqs), pos, tables,
                        [1, 2, 3], list(range(len(seqs))))


def general_path(model, batch, cache):
    """The general forward for a decode batch (the path a model without a static publisher plan takes)."""
    carry = model.decode_carry
    model.decode_carry = None
    try:
        return model(batch, cache)
    finally:
        model.decode_carry = carry


@pytest.mark.parametrize("width", [2, 5])
def test_decode_path_equals_general_path(prefilled, width):
    model, cache, seqs, tables = prefilled
    fixed, general = copy.deepcopy(cache), copy.deepcopy(cache)
    for step in range(3):
        batch = decode_batch(seqs, tables, step)
        batch.tensors = StepTensors.build(batch, CPU, width)
        assert model.decode_ready(batch.slots, fixed)  # else both sides would run the general path
        got = model(batch, fixed)
        want = general_path(model, decode_batch(seqs, tables, step), general)
        assert torch.equal(got, want), f"step {step}: max diff {float((got - want).abs().max())}"
    # everything but the sentinels (block 0, slot 0), where decode_forward parks the writes of rows that have
    # nothing to write
    W = model.config.sliding_window
    for lid, ring in fixed.window.items():
        assert torch.equal(ring[W:], general.window[lid][W:]), f"window[{lid}]"
    for name in ("compressed_kv", "index_k"):
        for lid, rows in getattr(fixed, name).items():
            epb = BLOCK_SIZE // model.roles[lid].ratio
            assert torch.equal(rows[epb:], getattr(general, name)[lid][epb:]), f"{name}[{lid}]"
    for name in ("comp_kv_state", "comp_score_state"):
        for lid, st in getattr(fixed, name).items():
            assert torch.equal(st[1:], getattr(general, name)[lid][1:]), f"{name}[{lid}]"
    assert torch.equal(fixed.engram_history[1:], general.engram_history[1:])
    assert fixed.index_k_publisher == general.index_k_publisher


def test_padding_rows_write_only_the_sentinels(prefilled):
    """Two real rows (slots 1 and 3) plus three padding rows: slot 2's state and blocks are untouched, and the
    real rows' logits are those of the unpadded step (close: CPU matmuls may round by row count)."""
    model, cache, seqs, tables = prefilled
    padded, plain = copy.deepcopy(cache), copy.deepcopy(cache)
    real = [0, 2]
    pos = [PROMPT_LENS[i] for i in real]
    ids = [seqs[i][p] for i, p in zip(real, pos)]
    width = 2
    batch = ForwardBatch(torch.tensor(ids), [1, 1], pos, [tables[i] for i in real], [1, 3], [0, 1])
    want = model(batch, plain)
    n_pad = 3
    pad = ForwardBatch(torch.tensor(ids + [0] * n_pad), [1] * (2 + n_pad), pos + [0] * n_pad,
                       [tables[i] for i in real] + [[]] * n_pad, [1, 3] + [0] * n_pad, list(range(2 + n_pad)))
    t = StepTensors.build(pad, CPU, width)
    got = model.decode_forward(pad.input_ids, t, padded)[:2]
    torch.testing.assert_close(got, want, rtol=0, atol=0.05)
    assert float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)) > 0.9999
    W = model.config.sliding_window
    untouched_slots = [2]
    blocks = sorted({b for i, tb in enumerate(tables) for b in tb if i not in real})
    for lid, ring in padded.window.items():
        for s in untouched_slots:
            assert torch.equal(ring[s * W:(s + 1) * W], cache.window[lid][s * W:(s + 1) * W])
    for name in ("compressed_kv", "index_k"):
        for lid, rows in getattr(padded, name).items():
            epb = BLOCK_SIZE // model.roles[lid].ratio
            for b in blocks:
                assert torch.equal(rows[b * epb:(b + 1) * epb], getattr(cache, name)[lid][b * epb:(b + 1) * epb])
    for name in ("comp_kv_state", "comp_score_state"):
        for lid, st in getattr(padded, name).items():
            for s in untouched_slots:
                assert torch.equal(st[s], getattr(cache, name)[lid][s])
    for s in untouched_slots:
        assert torch.equal(padded.engram_history[s], cache.engram_history[s])


def test_publisher_plan_of_the_tiny_model():
    """Layer 2 (ratio 2, FULL) scores its own keys where its group closes, else layer 4's (the last FULL layer,
    ratio 1, which publishes every step); with the quirk off every FULL layer scores its own."""
    plan, carry = _decode_publisher_plan(tiny_config())
    assert carry == 4
    assert plan == {2: [(2, 2), (4, None)], 4: [(4, None)], 6: [(4, None)]}
    plan, carry = _decode_publisher_plan(dataclasses.replace(tiny_config(), index_k_reference_quirk=False))
    assert carry == 4
    assert plan == {2: [(2, None)], 4: [(4, None)], 6: [(4, None)]}


def test_no_static_plan_when_the_last_full_layer_may_not_publish():
    """A model whose last FULL layer has ratio 2 leaves a publisher that depends on the position: no static plan,
    decode steps take the general path."""
    cfg = dataclasses.replace(tiny_config(), compress_ratios=(0, 0, 1, 1, 2, 2, 2, 2, 0, 0, 0))
    assert _decode_publisher_plan(cfg) == ({}, None)


def test_step_tensors_pad_tables_with_the_sentinel_block():
    batch = ForwardBatch(torch.tensor([5, 6, 7]), [2, 1], [0, 9], [[3], [4, 8]], [2, 1], [1, 2])
    t = StepTensors.build(batch, CPU, width=4)
    assert t.positions.tolist() == [0, 1, 9]
    assert t.block_tables.tolist() == [[3, 0, 0, 0], [4, 8, 0, 0]]
    assert t.slots.tolist() == [2, 1] and t.sample_rows.tolist() == [1, 2]
    assert t.row_seq.tolist() == [0, 0, 1] and t.context_lens.tolist() == [0, 9]
    assert t.query_starts.tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="width"):
        StepTensors.build(batch, CPU, width=1)
    assert batch.is_decode is False
    assert ForwardBatch(torch.tensor([1]), [1], [3], [[1]], [1], [0]).is_decode is True
