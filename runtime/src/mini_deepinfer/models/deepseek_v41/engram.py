"""Engram n-gram hashing (host side): compressed token map, per-layer multipliers and primes, row ids.

V41_MODEL.md 2.5. For every position p and n-gram order n = 2..max_ngram, the last n compressed token ids are
mixed by multiply-xor with four odd per-layer multipliers and reduced modulo one prime per (order, head); each
(order, head) owns a bucket of the layer's table, so a token gets orders x heads row ids.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from mini_deepinfer.models.deepseek_v41.config import V41Config

INT64_MAX = np.iinfo(np.int64).max


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def _next_unused_prime(after: int, used: set[int]) -> int:
    n = after + 1
    while not _is_prime(n) or n in used:
        n += 1
    return n


@lru_cache(maxsize=None)
def _engram_primes_cached(layer_ids: tuple[int, ...], vocab: int, n_orders: int, n_heads: int) -> tuple:
    used: set[int] = set()
    out = []
    for _ in layer_ids:
        layer = []
        for _order in range(n_orders):
            cur = vocab - 1  # restart per order; skip primes any earlier (layer, order, head) took
            row = []
            for _h in range(n_heads):
                p = _next_unused_prime(cur, used)
                used.add(p)
                row.append(p)
                cur = p
            layer.append(tuple(row))
        out.append(tuple(layer))
    return tuple(out)


def engram_primes(cfg: "V41Config") -> list[list[list[int]]]:
    """primes[layer_index][order_index][head]; orders 2..max_ngram, layers in engram_layer_ids order."""
    t = _engram_primes_cached(tuple(cfg.engram_layer_ids), cfg.engram_vocab_size, cfg.n_engram_orders,
                              cfg.engram_n_heads)
    return [[list(r) for r in layer] for layer in t]


def engram_table_sizes(cfg: "V41Config") -> list[int]:
    return [sum(sum(r) for r in layer) for layer in engram_primes(cfg)]


def engram_multipliers(cfg: "V41Config", layer_id: int) -> np.ndarray:
    """Four odd int64 multipliers of one layer (numpy default_rng seeded with 10007 * layer_id)."""
    return _multipliers_cached(layer_id, cfg.engram_compressed_vocab_size, cfg.engram_max_ngram_size).copy()


@lru_cache(maxsize=None)
def _multipliers_cached(layer_id: int, compressed_vocab: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(10007 * layer_id)
    high = (INT64_MAX // compressed_vocab) // 2
    return rng.integers(0, high, n).astype(np.int64) * 2 + 1


def _normalize_token_text(text: str) -> str:
    t = unicodedata.normalize("NFKC", text)
    t = unicodedata.normalize("NFD", t)
    t = "".join(c for c in t if unicodedata.category(c) != "Mn")
    t = t.lower()
    t = re.sub(r"\s+", " ", t)
    return t.strip()


def compressed_token_map(cfg: "V41Config", tokenizer_json: str | Path | None = None) -> torch.Tensor:
    """int64 [vocab_size]: token id -> compressed id.

    With a `tokenizer.json` (BPE vocab), each token's text is normalised (NFKC, NFD, accents stripped, lower case,
    whitespace collapsed and stripped) and distinct keys are numbered in id order; tokens whose text holds U+FFFD
    are keyed by their raw string. Without one, the documented deterministic fallback is id % compressed_vocab_size.
    """
    V, C = cfg.vocab_size, cfg.engram_compressed_vocab_size
    if tokenizer_json is None:
        return torch.arange(V, dtype=torch.int64) % C
    with open(tokenizer_json) as f:
        vocab: dict[str, int] = json.load(f)["model"]["vocab"]
    by_id = sorted(((i, s) for s, i in vocab.items()), key=lambda t: t[0])
    key_ids: dict[str, int] = {}
    out = torch.zeros(V, dtype=torch.int64)
    for i, s in by_id:
        if i >= V:
            continue
        text = _decode_bytelevel(s)
        key = s if "\ufffd" in text else _normalize_token_text(text)
        out[i] = key_ids.setdefault(key, len(key_ids))
    if len(key_ids) > C:
        raise ValueError(f"tokenizer gives {len(key_ids)} compressed ids, config allows {C}")
    return out


def _bytelevel_table() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTES = _bytelevel_table()


def _decode_bytelevel(s: str) -> str:
    return bytes(_BYTES.get(c, 32) for c in s).decode("utf-8", errors="replace")


def engram_row_ids(cfg: "V41Config", layer_index: int, compressed: torch.Tensor, pad: int,
                   history: torch.Tensor | None = None, blocked: torch.Tensor | None = None,
                   multipliers: torch.Tensor | None = None) -> torch.Tensor:
    """Row ids into one Engram layer's table for every position.

    compressed: int64 [S] compressed ids of the new tokens. history: int64 [max_ngram-1] compressed ids of the
    tokens before them (oldest first, `pad` where the sequence had not started). blocked: bool [S], True where
    the token is an image token: a look-back that reaches one uses `pad` for it and every longer shift.
    multipliers: the layer's engram_multipliers as an int64 tensor on compressed's device (the engine model keeps
    them there, so a forward copies nothing from the host); None makes them here.
    Returns int64 [S, orders * heads].
    """
    layer_id = cfg.engram_layer_ids[layer_index]
    n_max = cfg.engram_max_ngram_size
    S = compressed.shape[0]
    if history is None:
        history = torch.full((n_max - 1,), pad, dtype=torch.int64, device=compressed.device)
    seq = torch.cat([history.to(torch.int64), compressed.to(torch.int64)])
    blk = torch.zeros(seq.shape[0], dtype=torch.bool, device=seq.device)
    if blocked is not None:
        blk[n_max - 1:] = blocked
    # shifted[k][p] = compressed id of token p-k, or pad once the look-back has crossed a block
    shifted = []
    alive = torch.ones(S, dtype=torch.bool, device=seq.device)
    for k in range(n_max):
        tok = seq[n_max - 1 - k: n_max - 1 - k + S]
        if k > 0:
            alive = alive & ~blk[n_max - 1 - k: n_max - 1 - k + S]
        shifted.append(torch.where(alive, tok, torch.full_like(tok, pad)))
    if multipliers is None:
        multipliers = torch.from_numpy(engram_multipliers(cfg, layer_id)).to(seq.device)
    return engram_hash(cfg, layer_index, shifted, multipliers)


def engram_hash(cfg: "V41Config", layer_index: int, shifted: list[torch.Tensor], multipliers: torch.Tensor
                ) -> torch.Tensor:
    """Row ids from the look-backs: shifted[k] int64 [...] = compressed id of the token k positions back (pad
    before the start), k = 0 .. max_ngram - 1; multipliers int64 [max_ngram] on their device.
    Returns int64 [..., orders * heads]."""
    primes = engram_primes(cfg)[layer_index]
    ids = []
    offset = 0
    roll = shifted[0] * multipliers[0]
    for n in range(2, cfg.engram_max_ngram_size + 1):
        roll = roll ^ (shifted[n - 1] * multipliers[n - 1])
        for p in primes[n - 2]:
            ids.append(roll % p + offset)
            offset += p
    return torch.stack(ids, dim=-1)


def compressed_pad_id(cfg: "V41Config", token_map: torch.Tensor | None = None) -> int:
    """The pad used for look-backs before the start: the compressed id of engram_pad_token_id (U5: as port F)."""
    if token_map is not None:
        return int(token_map[cfg.engram_pad_token_id])
    return cfg.engram_pad_token_id % cfg.engram_compressed_vocab_size
