"""DeepSeek-V4.1 for the engine: batched and paged.

One forward runs any mix of prefill chunks (starting at any position) and decode tokens, reading and writing the
paged, quantized cache (cache.py) of exactly the blocks and slots the ForwardBatch names. Token-wise work
(projections, hyper-connections, MoE) runs on all T tokens at once; so does the work that depends on a sequence's
own history (window rows, compressor groups, Engram look-back), through each row's sequence metadata (StepRows), but
the indexer, whose keys differ per sequence, scores each sequence apart. It composes the same ops as the sequential
reference (reference.py), so any difference between the two is in state handling, which is what the engine tests
check.

No host synchronisation on CUDA: every index the forward needs comes from the step's StepTensors (made by the runner
before the forward, one non-blocking copy), Python branches depend only on host-known lengths, and selections keep
fixed shapes (-1 padding, masks). Decode steps (every sequence adds one token to a non-empty cache) take
`decode_forward`, whose shapes depend only on the batch size and the block-table width, never on positions or
lengths: a token's compressor group closing, the layer whose index keys it scores (the spec 2.4 publisher) and the
keys it may see are masks over fixed-size tensors, and rows that write nothing useful write to block 0 / slot 0,
the sentinels no sequence owns. That is what lets the runner capture it in a CUDA graph (worker/cuda_graphs.py).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

import torch
from mini_flashmla import (
    candidate_blocks_of_scores,
    candidate_positions,
    indexer_scores,
    sparse_mla_fwd_paged,
    topk_of_scores,
)
from mini_flashmla.cache_layout import pack_compressed_kv_fp4, pack_index_k_fp4, pack_window_fp8

from mini_deepinfer.layers.entry_rows import table_rows, visible_entry_rows
from mini_deepinfer.models.deepseek_v41 import bounded_replay, moe, ops
from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE, V41Cache
from mini_deepinfer.models.deepseek_v41.config import LayerMode, LayerRole, V41Config
from mini_deepinfer.models.deepseek_v41.engram import (
    compressed_token_map,
    engram_hash,
    engram_multipliers,
)
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors


def _ring_ids(slots: torch.Tensor, wpos: torch.Tensor, window: int) -> torch.Tensor:
    """The window ring rows of positions wpos (int64 [B, n], -1 = none) in each row's slot: slot x W + wpos % W, with
    the -1 kept."""
    return torch.where(wpos >= 0, slots[:, None] * window + wpos % window, wpos)


@dataclass(frozen=True)
class DecodeRows:
    """Per-row device metadata of a decode step (one token per sequence), int64 / bool [B, ...] unless noted; built
    once per step by of_step, since every layer reads the same rows (session 43: the window rows had been
    recomputed in each layer, ~10 small kernels per layer)."""

    pos: torch.Tensor  # [B]
    slots: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, width]
    closes: dict[int, torch.Tensor]  # ratio > 1 -> bool [B]: this token closes its compressor group
    ring_rows: torch.Tensor  # [B]: the window ring row this token writes, slot x W + pos % W
    window_ids: torch.Tensor  # int32 [B, W]: the ring rows of positions pos - W + 1 .. pos, -1 before the start

    @classmethod
    def of_step(cls, t: StepTensors, ratios: set[int], window: int) -> DecodeRows:
        """A step's rows from its tensors; ratios: the model's compressor ratios above 1; window: W."""
        pos, slots = t.positions, t.slots
        window_ids = _ring_ids(slots, ops.window_positions(pos, window), window).to(torch.int32)
        return cls(pos, slots, t.block_tables, {r: (pos + 1) % r == 0 for r in ratios},
                   slots * window + pos % window, window_ids)

    def entry_rows(self, entries: torch.Tensor, ratio: int) -> torch.Tensor:
        """Flat cache rows of compressed entries int64 [B, n] at compression ratio `ratio`."""
        return table_rows(self.block_tables, entries, BLOCK_SIZE // ratio)


@dataclass
class SeqSpan:
    """One sequence of the step: its query tokens are rows [start, start + qlen) of the flat batch, at positions
    first_pos .. end-1. Past a bounded-replay boundary the rows are the sequence's last ones: the step's first
    `dropped` positions (ctx .. first_pos-1) were computed up to the boundary but have no row here."""

    index: int
    start: int
    qlen: int
    ctx: int  # tokens already cached before this step
    slot: int
    block_table: torch.Tensor  # int64 on the model's device (a row of StepTensors.block_tables, padded with 0)
    dropped: int = 0

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.qlen)

    @property
    def first_pos(self) -> int:
        return self.ctx + self.dropped

    @property
    def end(self) -> int:  # sequence length after this step
        return self.ctx + self.dropped + self.qlen


@dataclass(frozen=True)
class StepRows:
    """Per-row device metadata of a general step (prefill chunks, or decode rows on the general path), int64 [rows]:
    what each row needs of its sequence, so that the window, the compressed rows, the compressor and the Engram
    look-back run as a few operations per layer for the whole step, not per sequence (session 80: the loops had cost
    ~740 torch ops per sequence of the tiny model's step, docs/reports/runtime-step-rows.md). Built once per step;
    past a bounded-replay boundary, the kept rows' (`kept`)."""

    row: torch.Tensor  # [rows] 0 .. rows-1
    seq: torch.Tensor  # [rows] the row's sequence in the step
    pos: torch.Tensor  # [rows] its position
    slot: torch.Tensor  # [rows] its sequence's state slot
    ctx: torch.Tensor  # [rows] tokens its sequence had cached before the step
    first_pos: torch.Tensor  # [rows] its sequence's first position with a row here (ctx unless rows were dropped)
    end: torch.Tensor  # [rows] its sequence's length after the step
    seq_end: torch.Tensor  # [B] per sequence: its length after the step
    seq_starts: torch.Tensor  # [B + 1] per sequence: its first row here, then rows

    @classmethod
    def of_step(cls, t: StepTensors) -> StepRows:
        seq = t.row_seq
        seq_end = t.context_lens + (t.query_starts[1:] - t.query_starts[:-1])
        ctx = t.context_lens[seq]
        return cls(torch.arange(seq.shape[0], device=seq.device), seq, t.positions, t.slots[seq], ctx, ctx,
                   seq_end[seq], seq_end, t.query_starts)

    def kept(self, rows: torch.Tensor, keep: int) -> StepRows:
        """The rows a bounded replay keeps (int64 index, each sequence's last `keep`)."""
        ctx, end, seq = self.ctx[rows], self.end[rows], self.seq[rows]
        starts = torch.searchsorted(seq, torch.arange(self.seq_starts.shape[0], device=rows.device))
        return StepRows(torch.arange(rows.shape[0], device=rows.device), seq, self.pos[rows], self.slot[rows], ctx,
                        torch.maximum(ctx, end - keep), end, self.seq_end, starts)


def true_rows(mask: torch.Tensor, n: int) -> torch.Tensor:
    """The indices of mask's True entries (bool [rows]) in order, int64 [n], where n = mask.sum() is known on the
    host: unlike nonzero, nothing waits for the device. Each True entry scatters its index to its rank among them,
    the others to a spare slot past the end."""
    rank = torch.where(mask, torch.cumsum(mask, 0) - 1, n)
    out = torch.empty(n + 1, dtype=torch.int64, device=mask.device)
    return out.scatter_(0, rank, torch.arange(mask.shape[0], device=mask.device))[:n]


# Query rows scored at once by the prefill indexer (see _indexer).
INDEXER_QUERY_SLICE = 4096
# The general forward's indexer scores sequences together when they read the same layer's keys and their entry counts
# n_k share a power-of-two bucket, so no row is scored against more than twice its own entries; counts up to this
# many share the first bucket (a row's scores of up to 4,096 entries are cheap whatever the width).
INDEXER_MIN_BUCKET_ENTRIES = 4096


def engine_weights(weights: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The engine model's weight dict on `device`: routed experts stacked per layer for the grouped GEMMs
    (moe.stack_experts), ops.prepare_weights' derived tensors, and per-expert views of the stacks (moe.expert_views)
    for code that reads experts one by one.

    The stacking happens on the weights' own device, before the move: from CPU (load_model reads checkpoints there)
    the target device gets one copy; weights that already sit on it (bench_prefill builds them there) coexist with
    their stacks until the caller drops them."""
    w = ops.prepare_weights({k: v.to(device) for k, v in moe.stack_experts(weights).items()})
    moe.expert_views(w)
    return w


class V41Model(torch.nn.Module):
    def __init__(self, config: V41Config, weights: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                 token_map: torch.Tensor | None = None, use_kernels: bool | None = None,
                 prefill_keep_tokens: int | None = None, fold_dense_fp8: bool = True):
        """use_kernels: run FP8/FP4 linears through mini-deepgemm (default: on CUDA). Attention and the indexer
        always go through mini-flashmla's API, which picks its Triton kernels on CUDA and its references on CPU.
        prefill_keep_tokens: bounded replay (None = full replay); see the property.
        fold_dense_fp8: with the kernels, the dense FP8 linears on the V3-recipe GEMMs (ops.KernelWeights)."""
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        w = engine_weights(weights, self.device)
        if use_kernels is None:
            use_kernels = self.device.type == "cuda"
        self.w = ops.KernelWeights(w, fold_dense_fp8=fold_dense_fp8) if use_kernels else w
        self.roles = config.layer_roles
        self.freqs = [ops.rope_freqs(config, r).to(self.device) for r in self.roles]
        self.token_map = (token_map if token_map is not None else compressed_token_map(config)).to(self.device)
        self.engram_pad = int(self.token_map[config.engram_pad_token_id])
        self.engram_mult = [torch.from_numpy(engram_multipliers(config, lid)).to(self.device)
                            for lid in config.engram_layer_ids]
        self.decode_publishers, self.decode_carry = _decode_publisher_plan(config)
        self.capture: list[torch.Tensor] | None = None  # set to [] to record each block's collapsed output
        self.prefill_keep_tokens = prefill_keep_tokens

    @property
    def prefill_keep_tokens(self) -> int | None:
        """Bounded replay: in the general (prefill) forward, only the last prefill_keep_tokens rows of each sequence
        go on past the boundary layer (bounded_replay.prefill_boundary_layer; decode rows always do), in every
        prefill chunk. Exact iff >= bounded_replay.exact_keep_tokens(config); None (the default) = full replay."""
        return self._prefill_keep_tokens

    @prefill_keep_tokens.setter
    def prefill_keep_tokens(self, keep: int | None) -> None:
        self._prefill_keep_tokens = bounded_replay.check_keep_tokens(self.config, keep)
        self._replay_boundary = None if keep is None else bounded_replay.prefill_boundary_layer(self.config)

    @property
    def cuda_graph_decode(self) -> bool:
        """Whether decode_forward may be captured in a CUDA graph: not when a subclass overrides the MoE or Engram
        with collectives (EP x DP), whose captured form is not set up here."""
        return (self.decode_carry is not None and type(self)._moe is V41Model._moe
                and type(self)._engram_inject is V41Model._engram_inject)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, cache: V41Cache) -> torch.Tensor:
        """Returns fp32 logits [len(batch.sample_rows), vocab]. Without batch.tensors set, they are made here (a
        host-to-device copy inside the forward: the runner sets them first)."""
        batch.validate(BLOCK_SIZE)
        t = batch.device_tensors(self.device)
        if batch.is_decode and self.decode_ready(batch.slots, cache):
            logits = self.decode_forward(batch.input_ids, t, cache)
            self.after_decode(batch.slots, cache)
            return logits
        cfg = self.config
        spans, start = [], 0
        for i, (q, c, s) in enumerate(zip(batch.query_lens, batch.context_lens, batch.slots)):
            spans.append(SeqSpan(i, start, q, c, s, t.block_tables[i]))
            start += q
        fresh = [sp.slot for sp in spans if sp.ctx == 0]
        if fresh:
            cache.reset_slots(fresh, self.engram_pad, t.slots[true_rows(t.context_lens == 0, len(fresh))])
        ids = batch.input_ids
        compressed = self.token_map[ids]
        history = cache.engram_history[t.slots]  # [B, max_ngram - 1], oldest first
        H, pre = ops.initial_streams(self.w["embed.weight"][ids], cfg)
        shared: dict = {"topk": None, "candidates": None}
        # the rows the layers compute (H's rows): all of the step's, or past a bounded-replay boundary the kept ones
        live, live_rows, sample_rows = spans, StepRows.of_step(t), t.sample_rows
        kept = None if self._prefill_keep_tokens is None else self._bounded_replay_rows(spans, batch.sample_rows)
        collapsed = None  # hc_collapse(H, pre), from the block that produced H
        for role in self.roles:
            p = f"layers.{role.layer_id}"
            if role.has_engram:  # never past the boundary (check_keep_tokens)
                H = self._engram(H, compressed, history, live_rows, role)
                collapsed = None
            H, pre, collapsed = ops.decoder_block(
                H, pre, self.w, role.layer_id, cfg,
                attention=lambda u, role=role: self._attention(u, live_rows, live, t, role, cache, shared),
                ffn=lambda v, p=p: self._moe(v, f"{p}.ffn"), collapsed=collapsed)
            if self.capture is not None:
                self.capture.append(collapsed.float())  # hc_collapse(H, pre), the next block's attention input
            if kept is not None and role.layer_id == self._replay_boundary:
                live, rows = kept
                H, pre, collapsed = H[rows], pre[rows], collapsed[rows]
                live_rows = live_rows.kept(rows, self._prefill_keep_tokens)
                new_row = torch.full_like(t.positions, -1)
                new_row[rows] = torch.arange(rows.shape[0], device=self.device)
                sample_rows = new_row[sample_rows]
                # the step's per-row shared state the consumer layers read: the top-k a REUSE layer takes over
                # and the candidate blocks a REINDEX layer restricts to (int32 [rows, kb])
                shared["topk"] = shared["topk"][rows]
                if shared["candidates"] is not None:
                    shared["candidates"] = shared["candidates"][rows]
        cache.engram_history[t.slots] = engram_history_after(history, compressed, t.query_starts)
        return ops.final_logits(H[sample_rows], pre[sample_rows], self.w, cfg)

    def _bounded_replay_rows(self, spans: list[SeqSpan], sample_rows: list[int]
                             ) -> tuple[list[SeqSpan], torch.Tensor] | None:
        """The rows that go on past the boundary: each sequence's last prefill_keep_tokens (decode rows and shorter
        chunks whole). Returns (the spans over those rows, their int64 index into the step's rows), or None when
        no row is dropped. Host-known lengths only; a sampled row that would be dropped is an error."""
        keep = self._prefill_keep_tokens
        drop = [max(0, sp.qlen - keep) for sp in spans]
        if not any(drop):
            return None
        starts = [sp.start for sp in spans]
        for row in sample_rows:
            i = bisect.bisect_right(starts, row) - 1
            if row < starts[i] + drop[i]:
                raise ValueError(f"bounded replay: sampled row {row} is not among sequence {i}'s last {keep} rows")
        kept, ranges, start = [], [], 0
        for sp, d in zip(spans, drop):
            kept.append(dataclasses.replace(sp, start=start, qlen=sp.qlen - d, dropped=d))
            start += sp.qlen - d
            lo, hi = sp.start + d, sp.start + sp.qlen
            if ranges and ranges[-1][1] == lo:  # one arange per run of whole sequences (decode rows)
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        return kept, torch.cat([torch.arange(lo, hi, device=self.device) for lo, hi in ranges])

    # ------------------------------------------------------------------ decode: fixed shapes, capturable
    def decode_ready(self, slots: list[int], cache: V41Cache) -> bool:
        """Host check that decode_forward applies: every slot's index-key publisher is the one a step leaves
        (always true after the sequence's first step when the model has a static plan)."""
        return self.decode_carry is not None and all(cache.index_k_publisher[s] == self.decode_carry for s in slots)

    def after_decode(self, slots: list[int], cache: V41Cache) -> None:
        """The host half of a decode step: the publisher every slot is left with."""
        for s in slots:
            cache.index_k_publisher[s] = self.decode_carry

    @torch.no_grad()
    def decode_forward(self, input_ids: torch.Tensor, t: StepTensors, cache: V41Cache) -> torch.Tensor:
        """One token per row at t.positions, on state the rows' slots and tables hold. Device work only: no host
        read, no shape that depends on a value, so it can be captured in a CUDA graph and replayed with new
        inputs. Returns fp32 logits [len(t.sample_rows), vocab]. Call after_decode (host) for the same slots."""
        cfg = self.config
        rows = DecodeRows.of_step(t, {r.ratio for r in self.roles if r.ratio > 1}, cfg.sliding_window)
        compressed = self.token_map[input_ids]
        history = cache.engram_history[t.slots]  # [B, max_ngram - 1], oldest first
        H, pre = ops.initial_streams(self.w["embed.weight"][input_ids], cfg)
        # the selection a layer publishes for the next (topk, candidates), and the cache rows of topk per ratio
        shared: dict = {"topk": None, "candidates": None, "comp_ids": {}}
        collapsed = None  # hc_collapse(H, pre), from the block that produced H
        for role in self.roles:
            p = f"layers.{role.layer_id}"
            if role.has_engram:
                li = cfg.engram_layer_ids.index(role.layer_id)
                seq = torch.cat([history, compressed[:, None]], dim=1)
                shifted = [seq[:, -1 - k] for k in range(cfg.engram_max_ngram_size)]
                H = self._engram_inject(H, engram_hash(cfg, li, shifted, self.engram_mult[li]), f"{p}.engram")
                collapsed = None
            H, pre, collapsed = ops.decoder_block(
                H, pre, self.w, role.layer_id, cfg,
                attention=lambda u, role=role: self._attention_decode(u, rows, role, cache, shared),
                ffn=lambda v, p=p: self._moe(v, f"{p}.ffn"), collapsed=collapsed)
            if self.capture is not None:
                self.capture.append(collapsed.float())  # hc_collapse(H, pre), the next block's attention input
        cache.engram_history[t.slots] = torch.cat([history[:, 1:], compressed[:, None]], dim=1)
        return ops.final_logits(H[t.sample_rows], pre[t.sample_rows], self.w, cfg)

    def _attention_decode(self, u, d: DecodeRows, role: LayerRole, cache: V41Cache, shared: dict):
        cfg, w, lid = self.config, self.w, role.layer_id
        p = f"layers.{lid}.attn"
        freqs = self.freqs[lid]
        qr, q, kv = ops.attention_qkv(u, d.pos, w, p, cfg, freqs)
        ring = cache.window[lid]
        ring[d.ring_rows] = pack_window_fp8(kv)  # written first: a decode token reads itself
        comp_table = comp_ids = None
        if role.ratio > 0:
            if role.mode == LayerMode.FULL:
                self._compress_decode(u, d, role, cache)
            if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
                shared["topk"] = self._indexer_decode(qr, u, d, role, cache, shared)
                shared["comp_ids"] = {}
            topk = shared["topk"]
            if topk is not None:
                comp_table = cache.compressed_kv[role.kv_source]
                # the REUSE layers after a selection read the same entries: their rows once per ratio
                comp_ids = shared["comp_ids"].get(role.ratio)
                if comp_ids is None:
                    comp_ids = torch.where(topk >= 0, d.entry_rows(topk.clamp_min(0), role.ratio), topk).to(
                        torch.int32)
                    shared["comp_ids"][role.ratio] = comp_ids
        o, _ = sparse_mla_fwd_paged(q, ring, comp_table, d.window_ids, comp_ids, cfg.head_dim ** -0.5,
                                    w[f"{p}.attn_sink"])
        return ops.attention_output(o, d.pos, w, p, cfg, freqs)

    def _compress_decode(self, u, d: DecodeRows, role: LayerRole, cache: V41Cache) -> None:
        """Every row pools its group as if it closed; only rows that close write the entry (the others write row 0
        of block 0), and only rows that do not close keep their token in the slot's tail (the others write slot 0)
        : the same cache contents as _compress."""
        cfg, w, lid, r = self.config, self.w, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        a, b = ops.compressor_project(u, w, p, cfg, r)
        group = d.pos // r
        rows = d.entry_rows(group[:, None], r)[:, 0]
        if r == 1:
            latent = a
        else:
            kst, sst = cache.comp_kv_state[lid], cache.comp_score_state[lid]  # [slots, r, D]
            j = d.pos % r
            mine = (torch.arange(r, device=self.device)[None, :] == j[:, None])[:, :, None]  # [B, r, 1]
            kv_g = torch.where(mine, a[:, None, :], kst[d.slots])
            sc_g = torch.where(mine, b[:, None, :], sst[d.slots])
            latent = ops.compressor_pool(kv_g, sc_g, w[f"{p}.compressor.norm.weight"], cfg.rms_norm_eps)
            closes = d.closes[r]
            tail_slot = torch.where(closes, torch.zeros_like(d.slots), d.slots)
            kst[tail_slot, j] = a
            sst[tail_slot, j] = b
            rows = torch.where(closes, rows, torch.zeros_like(rows))
        gpos = group * r
        # packed before the round trips (ops.compressed_kv_rotated): one quantization, the reference's values
        freqs = self.freqs[lid]
        cache.compressed_kv[lid][rows] = pack_compressed_kv_fp4(ops.compressed_kv_rotated(latent, gpos, w, freqs))
        cache.index_k[lid][rows] = pack_index_k_fp4(ops.index_key_rotated(latent, gpos, w, p, cfg, freqs))

    def _indexer_decode(self, qr, u, d: DecodeRows, role: LayerRole, cache: V41Cache, shared: dict):
        """_indexer for one token per row, over every entry the block-table width can hold (n_cap), -1 / -inf
        past each row's own count. Returns int64 [B, index_topk]."""
        cfg, w, lid, r = self.config, self.w, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        qi, wts = ops.indexer_queries(qr, u, d.pos, w, p, cfg, self.freqs[lid])
        qi, wts = qi.contiguous(), wts.contiguous()
        n_k = (d.pos + 1) // r  # entries each row may see
        n_cap = d.block_tables.shape[1] * BLOCK_SIZE // r
        score = None
        # a REINDEX layer scores only its rows' candidate blocks (the candidate source's, this step)
        blocks = shared["candidates"] if role.uses_candidates else None
        # the publisher chain (spec 2.4): the last entry is unconditional, earlier ones apply where their ratio's
        # group closes this step
        for pub, ratio_cond in reversed(self.decode_publishers[lid]):
            key_rows = visible_entry_rows(d.block_tables, n_k, BLOCK_SIZE // self.roles[pub].ratio, n_cap)
            s = indexer_scores(qi, wts, cache.index_k[pub], n_k, key_rows, blocks, cfg.candidate_block_size)
            score = s if score is None else torch.where(d.closes[ratio_cond][:, None], s, score)
        if role.is_candidate_source:
            # candidate_blocks_of_scores forces the block of the newest entry; +inf on that entry does the same
            newest = (n_k - 1).clamp_min(0)[:, None]
            forced = score.scatter(1, newest, torch.where(n_k[:, None] > 0, float("inf"), float("-inf")))
            shared["candidates"] = candidate_blocks_of_scores(forced, 0, cfg.candidate_block_size,
                                                              cfg.candidate_topk_blocks)
        sel = topk_of_scores(score, cfg.index_topk)
        if blocks is not None:
            sel = candidate_positions(sel, blocks, cfg.candidate_block_size)
        topk = torch.full((n_k.shape[0], cfg.index_topk), -1, dtype=torch.int64, device=self.device)
        topk[:, : sel.shape[1]] = sel.to(torch.int64)
        return topk

    # ------------------------------------------------------------------ Engram
    def _engram(self, H, compressed, history, rows: StepRows, role: LayerRole) -> torch.Tensor:
        li = self.config.engram_layer_ids.index(role.layer_id)
        return self._engram_inject(H, self._engram_row_ids(compressed, history, rows, li),
                                   f"layers.{role.layer_id}.engram")

    def _engram_row_ids(self, compressed, history, rows: StepRows, layer_index: int) -> torch.Tensor:
        """engram.engram_row_ids of every sequence of the step at once: int64 [rows, orders * heads].
        compressed: int64 [rows] the step's compressed ids; history: int64 [B, max_ngram - 1] each sequence's before
        the step (oldest first). The look-back k of a row j tokens into its sequence's step is the step's row k back
        where j >= k, else its history."""
        n_hist = history.shape[1]
        j = rows.pos - rows.ctx
        shifted = [compressed] + [torch.where(j >= k, compressed[(rows.row - k).clamp_min(0)],
                                              history[rows.seq, (j + n_hist - k).clamp(0, n_hist - 1)])
                                  for k in range(1, n_hist + 1)]
        return engram_hash(self.config, layer_index, shifted, self.engram_mult[layer_index])

    # ------------------------------------------------------------------ the layers EP x DP shards (parallel.py)
    def _moe(self, v: torch.Tensor, p: str) -> torch.Tensor:
        """The MoE of one block: grouped GEMMs, no host sync (moe.py; ops.moe is its oracle).
        parallel.ExpertParallelV41Model overrides it to split the routed experts across ranks; this single-process
        version is the oracle it is tested against."""
        return moe.moe_grouped(v, self.w, p, self.config)

    def _engram_inject(self, H: torch.Tensor, row_ids: torch.Tensor, p: str) -> torch.Tensor:
        """Engram of one block. parallel.ExpertParallelV41Model overrides it to shard the table rows."""
        return ops.engram_inject(H, row_ids, self.w, p, self.config)

    # ------------------------------------------------------------------ attention
    def _attention(self, u, rows: StepRows, spans: list[SeqSpan], t: StepTensors, role: LayerRole, cache: V41Cache,
                   shared: dict):
        cfg, w, lid = self.config, self.w, role.layer_id
        p = f"layers.{lid}.attn"
        freqs = self.freqs[lid]
        qr, q, kv = ops.attention_qkv(u, rows.pos, w, p, cfg, freqs)
        packed = pack_window_fp8(kv)
        decode_only = all(sp.qlen == 1 for sp in spans)
        win_table, win_ids = self._window(packed, rows, spans, t.slots, cache.window[lid], decode_only)

        comp_table = comp_ids = None
        if role.ratio > 0:
            if role.mode == LayerMode.FULL:
                self._compress(u, rows, spans, t, role, cache)
            if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
                shared["topk"] = self._indexer(qr, u, rows, spans, t, role, cache, shared)
            topk = shared["topk"]
            if topk is not None:
                comp_table = cache.compressed_kv[role.kv_source]
                epb = BLOCK_SIZE // role.ratio
                comp_ids = torch.where(topk >= 0, table_rows(t.block_tables, topk.clamp_min(0), epb, rows.seq[:, None]),
                                       topk)
        o, _ = sparse_mla_fwd_paged(q, win_table, comp_table, win_ids.to(torch.int32),
                                    None if comp_ids is None else comp_ids.to(torch.int32), cfg.head_dim ** -0.5,
                                    w[f"{p}.attn_sink"])
        if not decode_only:
            self._write_window(packed, rows, spans, cache.window[lid])
        return ops.attention_output(o, rows.pos, w, p, cfg, freqs)

    def _window(self, packed, rows: StepRows, spans: list[SeqSpan], slots: torch.Tensor, ring: torch.Tensor,
                decode_only: bool):
        """The rows the window part reads and their ids, window positions p-W+1..p in ascending order.
        packed: this step's window rows, uint8 [rows, 528]; slots: int64 [B] (StepTensors.slots). Returns (table,
        ids int64 [rows, W], -1 where none).

        Decode-only steps write the new row into the ring first and read the ring directly. A prefill chunk
        cannot (its later tokens would overwrite ring rows its earlier tokens still read), so its table is the
        ring rows of this batch's slots followed by the step's own packed rows; the ring is written after attention.
        """
        W = self.config.sliding_window
        wpos = ops.window_positions(rows.pos, W)
        if decode_only:
            self._write_window(packed, rows, spans, ring)
            return ring, _ring_ids(rows.slot, wpos, W)
        table = torch.cat([ring.view(-1, W, ring.shape[1])[slots].flatten(0, 1), packed])
        # a row's sequence's rows are consecutive positions: position wp is row (row - pos + wp) of the step
        step_row = slots.shape[0] * W + rows.row[:, None] + (wpos - rows.pos[:, None])
        ring_row = rows.seq[:, None] * W + wpos % W
        # positions a bounded replay dropped (ctx <= wp < first_pos) have no row and their ring rows hold older
        # positions: masked, like positions before the sequence start
        in_ring = (wpos >= 0) & (wpos < rows.ctx[:, None])
        ids = torch.where(wpos >= rows.first_pos[:, None], step_row, torch.where(in_ring, ring_row, -1))
        return table, ids

    def _write_window(self, packed, rows: StepRows, spans: list[SeqSpan], ring: torch.Tensor) -> None:
        """Keep the last W positions of each sequence in its ring (row = slot * W + pos % W)."""
        W = self.config.sliding_window
        last = true_rows(rows.pos >= rows.end - W, sum(min(sp.qlen, W) for sp in spans))
        ring[rows.slot[last] * W + rows.pos[last] % W] = packed[last]

    def _compress(self, u, rows: StepRows, spans: list[SeqSpan], t: StepTensors, role: LayerRole,
                  cache: V41Cache) -> None:
        """Pool every group closed by this step's tokens (carrying a partial group in the slot), then write the
        compressed KV and index-key rows of the new entries. Publishes the index keys (spec 2.4).

        A group closes at the row of its last position, (pos + 1) % r == 0; the host knows how many close (and
        how many rows the open groups keep), so their rows come out of fixed-size selections (true_rows). FULL
        layers precede any bounded-replay boundary, so every sequence has all its step rows here."""
        cfg, w, lid, r = self.config, self.w, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        freqs = self.freqs[lid]
        a, b = ops.compressor_project(u, w, p, cfg, r)
        closing = [sp.end // r > sp.ctx // r for sp in spans]
        n_close = sum(sp.end // r - sp.ctx // r for sp in spans)
        for sp, closes in zip(spans, closing):
            if closes or not cfg.index_k_reference_quirk:
                cache.index_k_publisher[sp.slot] = lid
        publisher = cache.index_k_publisher_device  # the same writes on the device copy
        if all(closing) or not cfg.index_k_reference_quirk:
            publisher.index_fill_(0, t.slots, lid)
        elif any(closing):
            closes = rows.seq_end // r > t.context_lens // r
            publisher[t.slots] = torch.where(closes, lid, publisher[t.slots])
        if r == 1:
            latent, at = a, rows.row
        else:
            kst, sst = cache.comp_kv_state[lid], cache.comp_score_state[lid]
            if n_close:
                at = true_rows((rows.pos + 1) % r == 0, n_close)
                # member m = pos - r + 1 + i of the group: the step's row for it, or the slot's tail before ctx
                m = rows.pos[at, None] - (r - 1) + torch.arange(r, device=self.device)
                from_step = (m >= rows.ctx[at, None])[:, :, None]
                step_row = (at[:, None] - rows.pos[at, None] + m).clamp_min(0)
                tail = (rows.slot[at, None], m % r)
                kv_g = torch.where(from_step, a[step_row], kst[tail])
                sc_g = torch.where(from_step, b[step_row], sst[tail])
                latent = ops.compressor_pool(kv_g, sc_g, w[f"{p}.compressor.norm.weight"], cfg.rms_norm_eps)
            # the open group's rows (pos // r == end // r) are the slot's new tail
            n_tail = sum(sp.end - max(sp.ctx, sp.end // r * r) for sp in spans)
            if n_tail:
                tail = true_rows(rows.pos // r == rows.end // r, n_tail)
                kst[rows.slot[tail], rows.pos[tail] % r] = a[tail]
                sst[rows.slot[tail], rows.pos[tail] % r] = b[tail]
        if not n_close:
            return
        gpos = rows.pos[at] - (r - 1)  # the group's first position
        entries = table_rows(t.block_tables, rows.pos[at] // r, BLOCK_SIZE // r, rows.seq[at])
        # packed before the round trips (ops.compressed_kv_rotated): one quantization, the reference's values
        cache.compressed_kv[lid][entries] = pack_compressed_kv_fp4(ops.compressed_kv_rotated(latent, gpos, w, freqs))
        cache.index_k[lid][entries] = pack_index_k_fp4(ops.index_key_rotated(latent, gpos, w, p, cfg, freqs))

    def _indexer(self, qr, u, rows: StepRows, spans: list[SeqSpan], t: StepTensors, role: LayerRole, cache: V41Cache,
                 shared: dict) -> torch.Tensor:
        """Top-k compressed entries per query row: int64 [rows, index_topk], -1 where none (or no entries yet).

        The step's sequences are scored together, one group per (publisher, entry bucket) (_indexer_groups): each
        group's rows in one ragged indexer_scores call per query slice, every sequence against its own entries
        (mini_flashmla's query_starts: its scores bit for bit those of the sequence scored alone), then one top-k.
        A row's score row is wider than its sequence's entries, by -inf columns past them, which the top-k and the
        candidate blocks rank below every entry of its own (the lowest position wins ties), so the selection is the
        sequence's own. The groups' rows come from the device copy of the publishers (no host copy); the host knows
        how many."""
        cfg, w, lid, r = self.config, self.w, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        block = cfg.candidate_block_size
        qi, wts = ops.indexer_queries(qr, u, rows.pos, w, p, cfg, self.freqs[lid])
        n_rows = rows.pos.shape[0]
        topk = torch.full((n_rows, cfg.index_topk), -1, dtype=torch.int64, device=self.device)
        groups = _indexer_groups(spans, r, cache.index_k_publisher)
        if role.is_candidate_source:
            most = max((sp.end // r for sp in spans), default=0)
            shared["candidates"] = torch.full((n_rows, min(cfg.candidate_topk_blocks, -(-most // block))), -1,
                                              dtype=torch.int32, device=self.device)
        if not groups:
            return topk
        n_k = rows.seq_end // r  # per sequence
        keys = None
        if len(groups) > 1 or len(next(iter(groups.values()))) < len(spans):
            bucket = torch.frexp(n_k.clamp_min(INDEXER_MIN_BUCKET_ENTRIES).to(torch.float64)).exponent
            keys = torch.where(n_k > 0, cache.index_k_publisher_device[t.slots] * 64 + bucket, -1)
        for (pub, bucket), members in groups.items():
            n_cap = max(sp.end // r for sp in members)
            if keys is None:  # every sequence, in step order
                seqs, at, starts = None, None, rows.seq_starts
            else:
                in_group = keys == pub * 64 + bucket
                # the members' sequence ids, then B (so the search below also gives the group's row count)
                seqs = true_rows(torch.cat([in_group, in_group.new_ones(1)]), len(members) + 1)
                at = true_rows(in_group[rows.seq], sum(sp.qlen for sp in members))
                starts = torch.searchsorted(rows.seq[at], seqs)
                seqs = seqs[:-1]
            key_rows = visible_entry_rows(t.block_tables if seqs is None else t.block_tables[seqs],
                                          n_k if seqs is None else n_k[seqs], BLOCK_SIZE // self.roles[pub].ratio,
                                          n_cap)
            self._score_group(qi, wts, rows, at, starts, key_rows, n_cap, cache.index_k[pub], role, topk, shared)
        return topk

    def _score_group(self, qi, wts, rows: StepRows, at: torch.Tensor | None, starts: torch.Tensor,
                     key_rows: torch.Tensor, n_cap: int, index_k: torch.Tensor, role: LayerRole, topk: torch.Tensor,
                     shared: dict) -> None:
        """_indexer for one group: its rows `at` (int64, None = every row) with their sequences' first rows
        `starts` (int64 [B_g + 1]) and key lists key_rows (int32 [B_g, n_cap]); writes topk's rows, and the
        candidate source's blocks (shared["candidates"]) or a REINDEX layer's restriction to them."""
        cfg, r = self.config, role.ratio
        block = cfg.candidate_block_size
        pick = (lambda x: x) if at is None else (lambda x: x[at])
        q, weights, end = pick(qi), pick(wts), pick(rows.end)
        visible = (pick(rows.pos) + 1) // r
        kb = min(cfg.candidate_topk_blocks, -(-n_cap // block))
        cand = pick(shared["candidates"])[:, :kb] if role.uses_candidates else None
        n = q.shape[0]
        # queries in slices: a [queries, entries] fp32 score (and top-k's keys) per slice, so a long chunk over a long
        # context fits (32k x 131k scores would be 17 GB at once)
        for q0 in range(0, n, INDEXER_QUERY_SLICE):
            q1 = min(n, q0 + INDEXER_QUERY_SLICE)
            sl = slice(q0, q1)
            blocks = None if cand is None else cand[sl]
            # a REINDEX layer scores only its candidate blocks' entries (V4.1: 16,384 of 131,072 at 131k)
            score = indexer_scores(q[sl], weights[sl], index_k, visible[sl], key_rows, blocks, block,
                                   query_starts=starts if q1 - q0 == n else starts.clamp(q0, q1) - q0)
            sel = topk_of_scores(score, cfg.index_topk)
            out_rows = sl if at is None else at[sl]
            if role.is_candidate_source:
                # the block of the sequence's newest entry is always a candidate (candidate_blocks_of_scores'
                # compress_len, per sequence here): +inf on that entry; the top-k above has read the score
                score.scatter_(1, (end[sl] // r - 1)[:, None], float("inf"))
                shared["candidates"][out_rows, :kb] = candidate_blocks_of_scores(score, 0, block,
                                                                                 cfg.candidate_topk_blocks)
            if blocks is not None:
                sel = candidate_positions(sel, blocks, block)
            topk[out_rows, : sel.shape[1]] = sel.to(torch.int64)


def _indexer_groups(spans: list[SeqSpan], ratio: int, publishers: list[int]
                    ) -> dict[tuple[int, int], list[SeqSpan]]:
    """The general forward's indexer groups, in step order: {(publisher, bucket): spans}, a sequence with entries
    (n_k = end // ratio > 0) in the group of the layer whose keys it reads and of n_k's bucket, the bit length of
    max(n_k, INDEXER_MIN_BUCKET_ENTRIES) (the device's torch.frexp exponent of the same)."""
    groups: dict[tuple[int, int], list[SeqSpan]] = {}
    for sp in spans:
        n_k = sp.end // ratio
        if n_k:
            key = (publishers[sp.slot], max(n_k, INDEXER_MIN_BUCKET_ENTRIES).bit_length())
            groups.setdefault(key, []).append(sp)
    return groups


def engram_history_after(history: torch.Tensor, compressed: torch.Tensor, query_starts: torch.Tensor
                         ) -> torch.Tensor:
    """Each sequence's Engram history after a step: the last max_ngram - 1 of (its history int64 [B, n], its step
    tokens compressed[query_starts[b]:query_starts[b + 1]]), as one gather."""
    n_hist = history.shape[1]
    starts, q_lens = query_starts[:-1, None], query_starts[1:, None] - query_starts[:-1, None]
    c = q_lens + torch.arange(n_hist, device=history.device)  # index into the concatenation
    from_step = compressed[(starts + c - n_hist).clamp_min(0)]
    return torch.where(c < n_hist, history.gather(1, c.clamp(max=n_hist - 1)), from_step)


def _decode_publisher_plan(cfg: V41Config) -> tuple[dict[int, list[tuple[int, int | None]]], int | None]:
    """Whose index keys each indexer layer scores in a decode step (spec 2.4: the last FULL layer that published).

    A FULL layer publishes every step when its ratio is 1 or the quirk is off, else only when its token closes a
    group, which depends on the position: so a layer's publisher is a chain [(layer, ratio or None)], read as
    "the first layer whose ratio's group closes, else the last (unconditional) one". Returns ({indexer layer:
    chain}, the publisher every step leaves), or ({}, None) when what a step leaves depends on the position
    (then decode runs the general path).
    """
    carry = -1  # stands for the publisher the slot holds before the step
    chain: list[tuple[int, int | None]] = [(carry, None)]
    plan: dict[int, list[tuple[int, int | None]]] = {}
    for role in cfg.layer_roles:
        if role.mode == LayerMode.FULL:
            if role.ratio == 1 or not cfg.index_k_reference_quirk:
                chain = [(role.layer_id, None)]
            else:
                chain = [(role.layer_id, role.ratio)] + [c for c in chain if c[1] != role.ratio]
        if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
            plan[role.layer_id] = list(chain)
    if len(chain) != 1 or chain[0][0] == carry:
        return {}, None
    left = chain[0][0]
    return {lid: [(left if layer == carry else layer, c) for layer, c in ch] for lid, ch in plan.items()}, left
