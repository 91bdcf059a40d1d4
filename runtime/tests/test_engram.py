"""Engram hashing (V41_MODEL.md 2.5): primes, multipliers, row ids, look-back padding, compressed token map."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from mini_deepinfer.models.deepseek_v41 import engram
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config
from mini_deepinfer.models.deepseek_v41.engram import (
    compressed_pad_id,
    compressed_token_map,
    engram_multipliers,
    engram_primes,
    engram_row_ids,
    engram_table_sizes,
)


def _primes_between(lo: int, hi: int) -> list[int]:
    """Primes p with lo < p < hi, by a segmented sieve (independent of engram.py's trial division)."""
    small = [q for q in range(2, int(hi**0.5) + 1) if all(q % d for d in range(2, int(q**0.5) + 1))]
    alive = np.ones(hi - lo - 1, dtype=bool)  # numbers lo+1 .. hi-1
    for q in small:
        start = max(q * q, ((lo + 1 + q - 1) // q) * q)
        alive[start - lo - 1:: q] = False
    return [lo + 1 + i for i in np.flatnonzero(alive)]


@pytest.mark.parametrize("make, sizes", [(V41Config, (384006168, 384016682)), (tiny_config, (6748, 7592))],
                         ids=["real", "tiny"])
def test_primes_sum_to_the_table_sizes(make, sizes):
    cfg = make()
    assert tuple(engram_table_sizes(cfg)) == sizes == tuple(cfg.engram_num_embeddings)


@pytest.mark.parametrize("make", [V41Config, tiny_config], ids=["real", "tiny"])
def test_primes_follow_the_greedy_rule(make):
    """Per (layer, order): the next unused primes above vocab-1, restarting per order, skipping earlier ones."""
    cfg = make()
    primes = engram_primes(cfg)
    assert len(primes) == len(cfg.engram_layer_ids)
    flat = [p for layer in primes for order in layer for p in order]
    assert len(flat) == len(set(flat)) == len(cfg.engram_layer_ids) * cfg.n_engram_orders * cfg.engram_n_heads
    candidates = _primes_between(cfg.engram_vocab_size - 1, max(flat) + 1)
    used: set[int] = set()
    for layer in primes:
        for order in layer:
            free = [p for p in candidates if p not in used]
            assert order == free[: cfg.engram_n_heads]
            used.update(order)


def test_multipliers_are_odd_bounded_and_per_layer():
    cfg = V41Config()
    high = (np.iinfo(np.int64).max // cfg.engram_compressed_vocab_size) // 2
    per_layer = [engram_multipliers(cfg, lid) for lid in cfg.engram_layer_ids]
    for m in per_layer:
        assert m.dtype == np.int64 and m.shape == (cfg.engram_max_ngram_size,)
        assert np.all(m % 2 == 1) and np.all(m > 0) and np.all(m < 2 * high)
    assert not np.array_equal(per_layer[0], per_layer[1])
    assert np.array_equal(engram_multipliers(cfg, 14), per_layer[1])  # deterministic
    # seeded with 10007 * layer_id (numpy default_rng)
    expect = np.random.default_rng(10007 * 14).integers(0, high, 4) * 2 + 1
    assert np.array_equal(per_layer[1], expect)


def _row_ids_oracle(cfg: V41Config, layer_index: int, seq: list[int], pad: int, blocked: list[bool]) -> list[list[int]]:
    """The spec's formula with Python integers, position by position."""
    lid = cfg.engram_layer_ids[layer_index]
    m = [int(v) for v in engram_multipliers(cfg, lid)]
    primes = engram_primes(cfg)[layer_index]
    out = []
    for p in range(len(seq)):
        toks, crossed = [], False
        for k in range(cfg.engram_max_ngram_size):
            crossed = crossed or p - k < 0 or (k > 0 and blocked[p - k])
            toks.append(pad if crossed else seq[p - k])
        row, offset, roll = [], 0, toks[0] * m[0]
        for n in range(2, cfg.engram_max_ngram_size + 1):
            roll ^= toks[n - 1] * m[n - 1]
            for prime in primes[n - 2]:
                row.append(roll % prime + offset)
                offset += prime
        out.append(row)
    return out


@pytest.mark.parametrize("make", [V41Config, tiny_config], ids=["real", "tiny"])
@pytest.mark.parametrize("length", [1, 2, 5, 67])
def test_row_ids_match_the_formula_and_stay_in_their_bucket(make, length):
    cfg = make()
    gen = torch.Generator().manual_seed(length)
    seq = torch.randint(0, cfg.engram_compressed_vocab_size, (length,), generator=gen)
    pad = compressed_pad_id(cfg)
    for li in range(len(cfg.engram_layer_ids)):
        ids = engram_row_ids(cfg, li, seq, pad)
        assert ids.dtype == torch.int64 and ids.shape == (length, cfg.n_engram_orders * cfg.engram_n_heads)
        assert ids.tolist() == _row_ids_oracle(cfg, li, seq.tolist(), pad, [False] * length)
        bucket_sizes = [p for order in engram_primes(cfg)[li] for p in order]
        starts = np.cumsum([0] + bucket_sizes[:-1])
        for j, (start, size) in enumerate(zip(starts, bucket_sizes)):
            assert torch.all((ids[:, j] >= start) & (ids[:, j] < start + size)), j
        assert int(ids.max()) < cfg.engram_num_embeddings[li]


def test_lookback_pads_at_the_sequence_start():
    """Position p < 3 hashes like the same tokens preceded by explicit pads."""
    cfg = tiny_config()
    pad = compressed_pad_id(cfg)
    seq = torch.tensor([7, 4001, 99091, 12, 5])
    ids = engram_row_ids(cfg, 0, seq, pad)
    padded = engram_row_ids(cfg, 0, torch.cat([torch.full((3,), pad), seq]), pad)
    assert torch.equal(ids, padded[3:])
    assert not torch.equal(ids[0], engram_row_ids(cfg, 0, torch.tensor([1, 1, 1, 7]), pad)[3])


def test_history_continues_a_sequence():
    cfg = tiny_config()
    pad = compressed_pad_id(cfg)
    seq = torch.randint(0, cfg.engram_compressed_vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    full = engram_row_ids(cfg, 1, seq, pad)
    for start in (1, 2, 3, 17):
        history = torch.cat([torch.full((3,), pad), seq])[start: start + 3]
        assert torch.equal(engram_row_ids(cfg, 1, seq[start:], pad, history=history), full[start:]), start


def test_image_tokens_block_longer_lookbacks():
    cfg = tiny_config()
    pad = compressed_pad_id(cfg)
    seq = torch.randint(0, cfg.engram_compressed_vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    blocked = torch.zeros(12, dtype=torch.bool)
    blocked[5] = True
    ids = engram_row_ids(cfg, 0, seq, pad, blocked=blocked)
    assert ids.tolist() == _row_ids_oracle(cfg, 0, seq.tolist(), pad, blocked.tolist())
    unblocked = engram_row_ids(cfg, 0, seq, pad)
    # positions whose look-back (3 tokens) does not reach token 5 are unchanged; the image token itself too
    same = [p for p in range(12) if not 5 < p <= 8]
    assert torch.equal(ids[same], unblocked[same])
    # just after the image token, every look-back is pad: as at a sequence start
    assert torch.equal(ids[6], engram_row_ids(cfg, 0, seq[6:7], pad)[0])


def test_compressed_token_map_fallback():
    cfg = tiny_config()
    m = compressed_token_map(cfg)
    assert m.dtype == torch.int64 and m.shape == (cfg.vocab_size,)
    assert torch.equal(m, torch.arange(cfg.vocab_size) % cfg.engram_compressed_vocab_size)
    assert compressed_pad_id(cfg) == compressed_pad_id(cfg, m) == 2


def test_compressed_token_map_from_tokenizer_json(tmp_path):
    """Normalised keys (NFKC, NFD, accents stripped, lower case, whitespace collapsed) numbered in id order;
    byte-level tokens that are not valid UTF-8 on their own keep their raw string as key."""
    to_char = {b: c for c, b in engram._BYTES.items()}

    def bytelevel(text: str) -> str:
        return "".join(to_char[b] for b in text.encode())

    words = ["<pad>", "Hello", " hello", "HÉLLO", "world", " World  ", "ｗｏｒｌｄ"]
    vocab = {bytelevel(w): i for i, w in enumerate(words)}
    vocab[to_char[0xC3]] = len(vocab)  # half of a UTF-8 sequence
    vocab[to_char[0xA9]] = len(vocab)  # the other half
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    cfg = tiny_config()
    m = compressed_token_map(cfg, path)
    assert m[: len(vocab)].tolist() == [0, 1, 1, 1, 2, 2, 2, 3, 4]


def test_compressed_token_map_rejects_too_many_keys(tmp_path):
    cfg = dataclasses.replace(tiny_config(), engram_compressed_vocab_size=4)
    vocab = {f"t{i}": i for i in range(5)}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": vocab}}))
    with pytest.raises(ValueError, match="compressed ids"):
        compressed_token_map(cfg, path)
