"""Bounded replay of a prefill through the consumer layers: which layers it concerns and when it is exact.

V4.1's layers after the last shared-state source (layer 20 of the real model: the last kv source and the candidate
source) read, from other layers, only that layer's compressed KV, index keys and candidate blocks, all computed for
every position of the prefill by the time they run. A prefill step can therefore send only the last `keep` rows of
each sequence on through them (V41Model.prefill_keep_tokens). What those rows still cannot see are the dropped rows'
contributions to the consumer layers' own sliding windows:

a consumer layer's window at position j reads its window KV at j-W+1..j, projections of the layer's input at those
positions, i.e. of the previous consumer layer's outputs, each of which read its own window further back. The
cone of positions a consumer output depends on therefore widens by W-1 per consumer layer, and the output of the
c-th consumer layer at position j is exact iff j - c*(W-1) >= the first kept position (or nothing was dropped).
For the last position of a step this is keep >= n_consumers * (W-1) + 1 (`exact_keep_tokens`); the rings the next
step reads (positions end-W+1..end-1 of each consumer layer) need keep >= n_consumers * (W-1), which that implies.
An engine that rolls a sequence back by r tokens after the step needs r more; this one never rolls back.
Below the bound bounded replay is an approximation (docs/reports/prefill-bounded-replay.md measures how far).
"""

from __future__ import annotations

from mini_deepinfer.models.deepseek_v41.config import V41Config


def prefill_boundary_layer(config: V41Config) -> int:
    """The last layer whose per-step output other layers read as shared state: the largest kv source of any
    compressed layer (FULL layers are their own source) and the candidate source when a layer uses its blocks.
    Later layers compute their top-k per row (REINDEX) or reuse a per-row top-k, which slices with the rows."""
    roles = config.layer_roles
    sources = {r.kv_source for r in roles if r.kv_source is not None}
    sources |= {config.candidate_source_layer_id for r in roles if r.uses_candidates}
    if not sources:
        raise ValueError("bounded replay needs a layer with compressed attention (a kv source) to bound at")
    return max(sources)


def consumer_layer_ids(config: V41Config) -> list[int]:
    """The layers after the boundary, which a bounded-replay prefill runs on the kept rows only."""
    return list(range(prefill_boundary_layer(config) + 1, config.num_hidden_layers))


def exact_keep_tokens(config: V41Config) -> int:
    """The smallest keep for which the last position's logits and every later step equal a full replay's:
    n_consumers * (window - 1) + 1 (2,414 for V4.1-Flash's 19 consumer layers, 382 for the tiny model's 3)."""
    return len(consumer_layer_ids(config)) * (config.sliding_window - 1) + 1


def check_keep_tokens(config: V41Config, keep: int | None) -> int | None:
    """Validates a prefill_keep_tokens value (None = full replay). keep must cover one window, so that every
    consumer layer's ring is fully written by the kept rows (the next step reads W-1 of its entries back); and no
    Engram layer may follow the boundary (its n-gram look-back would need the dropped tokens; V4.1's Engram layers
    1 and 14 precede layer 20)."""
    if keep is None:
        return None
    if keep < config.sliding_window:
        raise ValueError(f"prefill_keep_tokens={keep} < sliding_window={config.sliding_window}: the consumer layers' "
                         f"rings would keep positions the prefill never wrote")
    boundary = prefill_boundary_layer(config)
    late_engram = [lid for lid in config.engram_layer_ids if lid > boundary]
    if late_engram:
        raise ValueError(f"bounded replay: Engram layers {late_engram} follow the boundary layer {boundary}")
    return keep
