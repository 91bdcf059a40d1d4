"""The straightforward sequential reference of DeepSeek-V4.1: one sequence, unpaged, bf16 state.

Like the official inference/model.py it supports a prefill that starts at position 0 and single-token decode
steps after it. It is the oracle the engine (batched, paged, quantized cache) is tested against, so it favours
obviousness over speed: state is a dict of dense tensors, and each layer is one readable function call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from mini_flashmla.reference import candidate_block_mask_ref, indexer_scores_ref, indexer_topk_ref, sparse_attn_ref

from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import LayerMode, LayerRole, V41Config
from mini_deepinfer.models.deepseek_v41.engram import compressed_token_map, engram_row_ids


@dataclass
class ReferenceState:
    """Per-sequence attention state of the reference (V41_MODEL.md section 5)."""

    window: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> bf16 [window, head_dim] ring
    compress_kv: dict[int, torch.Tensor] = field(default_factory=dict)  # kv source -> bf16 [n, head_dim]
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)  # kv source -> bf16 [n, index_dim]
    comp_kv_state: dict[int, torch.Tensor] = field(default_factory=dict)  # ratio>1 source -> fp32 [r, head_dim]
    comp_score_state: dict[int, torch.Tensor] = field(default_factory=dict)  # ... initialised to -inf
    index_k_publisher: int | None = None  # the shipped reference's shared_attn.index_k, kept across steps
    engram_history: torch.Tensor | None = None  # compressed ids of the last max_ngram-1 tokens
    length: int = 0  # tokens processed so far


class ReferenceV41:
    def __init__(self, config: V41Config, weights: dict[str, torch.Tensor], device: str | torch.device = "cpu",
                 token_map: torch.Tensor | None = None):
        self.cfg = config
        self.device = torch.device(device)
        self.w = ops.prepare_weights({k: v.to(self.device) for k, v in weights.items()})
        self.roles = config.layer_roles
        self.freqs = [ops.rope_freqs(config, r).to(self.device) for r in self.roles]
        self.token_map = (token_map if token_map is not None else compressed_token_map(config)).to(self.device)
        self.capture: list[torch.Tensor] | None = None  # set to [] to record each block's collapsed output

    def new_state(self) -> ReferenceState:
        return ReferenceState()

    # ------------------------------------------------------------------ model
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start_pos: int, state: ReferenceState) -> torch.Tensor:
        """tokens: int64 [S]. Prefill at start_pos 0 (any S) or one decode token. Returns fp32 logits [S, vocab]."""
        cfg = self.cfg
        S = tokens.shape[0]
        if start_pos != state.length:
            raise ValueError(f"start_pos {start_pos} != tokens already processed {state.length}")
        if start_pos > 0 and S != 1:
            raise ValueError("the reference decodes one token per call after the prefill (spec U9)")
        tokens = tokens.to(self.device)
        positions = torch.arange(start_pos, start_pos + S, device=self.device)
        H, pre = ops.initial_streams(self.w["embed.weight"][tokens], cfg)
        compressed = self.token_map[tokens]
        shared: dict = {"topk": None, "candidates": None}
        for role in self.roles:
            p = f"layers.{role.layer_id}"
            if role.has_engram:
                H = self._engram(H, compressed, role, state)
            # Every block collapses its own input (collapsed=None), the same op on the same tensors as the engine's
            # hand-off of the previous block's collapse, so the reference's bits do not depend on it and the engine's
            # hand-off (its resets after Engram, its bounded-replay rows) is checked against an independent path.
            H, pre, collapsed = ops.decoder_block(
                H, pre, self.w, role.layer_id, cfg,
                attention=lambda u, role=role: self._attention(u, positions, role, state, shared),
                ffn=lambda v, p=p: ops.moe(v, self.w, f"{p}.ffn", cfg))
            if self.capture is not None:
                self.capture.append(collapsed.float())  # hc_collapse(H, pre)
        self._advance_engram_history(compressed, state)
        state.length += S
        return ops.final_logits(H, pre, self.w, cfg)

    # ------------------------------------------------------------------ Engram
    def _engram(self, H: torch.Tensor, compressed: torch.Tensor, role: LayerRole, state: ReferenceState):
        cfg = self.cfg
        li = cfg.engram_layer_ids.index(role.layer_id)
        pad = int(self.token_map[cfg.engram_pad_token_id])
        ids = engram_row_ids(cfg, li, compressed, pad, history=state.engram_history)
        return ops.engram_inject(H, ids, self.w, f"layers.{role.layer_id}.engram", cfg)

    def _advance_engram_history(self, compressed: torch.Tensor, state: ReferenceState) -> None:
        n = self.cfg.engram_max_ngram_size - 1
        pad = int(self.token_map[self.cfg.engram_pad_token_id])
        hist = state.engram_history
        if hist is None:
            hist = torch.full((n,), pad, dtype=torch.int64, device=self.device)
        state.engram_history = torch.cat([hist, compressed])[-n:]

    # ------------------------------------------------------------------ attention
    def _attention(self, u: torch.Tensor, positions: torch.Tensor, role: LayerRole, state: ReferenceState,
                   shared: dict) -> torch.Tensor:
        cfg, w, lid = self.cfg, self.w, role.layer_id
        p = f"layers.{lid}.attn"
        freqs = self.freqs[lid]
        S, W = positions.shape[0], cfg.sliding_window
        start = int(positions[0])
        end = start + S
        qr, q, kv = ops.attention_qkv(u, positions, w, p, cfg, freqs)

        # window part: prefill reads its own kv rows, decode reads the ring (slot = pos % W)
        ring = state.window.setdefault(lid, torch.zeros(W, cfg.head_dim, dtype=torch.bfloat16, device=self.device))
        wpos = ops.window_positions(positions, W)
        if start == 0:
            win_rows = kv
            win_idx = wpos
        else:
            ring[start % W] = kv[0]
            win_rows = ring
            win_idx = torch.where(wpos >= 0, wpos % W, wpos)
        for i in range(max(0, S - W), S):  # keep the last W positions in the ring
            ring[(start + i) % W] = kv[i]

        if role.ratio == 0:
            kv_all, idx = win_rows, win_idx
        else:
            r = role.ratio
            new_latent, group_pos = (self._compress(u, positions, role, state) if role.mode == LayerMode.FULL
                                     else (None, None))
            if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
                if end // r == 0:
                    shared["topk"] = None
                else:
                    shared["topk"] = self._indexer(qr, u, positions, role, state, shared, new_latent, group_pos)
            if new_latent is not None:
                entries = ops.compressed_kv_entry(new_latent, group_pos, w, freqs)
                self._append(state.compress_kv, lid, entries, int(group_pos[0]) // r)
            topk = shared["topk"]
            n_win = win_rows.shape[0]
            ckv = state.compress_kv.get(role.kv_source)
            if topk is None or ckv is None:
                kv_all, idx = win_rows, win_idx
            else:
                kv_all = torch.cat([win_rows, ckv[: end // r]])
                topk = topk.to(torch.int64)
                idx = torch.cat([win_idx, torch.where(topk >= 0, topk + n_win, topk)], dim=1)
        o, _ = sparse_attn_ref(q, kv_all, idx.to(torch.int32), cfg.head_dim ** -0.5, w[f"{p}.attn_sink"])
        return ops.attention_output(o, positions, w, p, cfg, freqs)

    @staticmethod
    def _append(store: dict[int, torch.Tensor], lid: int, rows: torch.Tensor, first: int) -> None:
        old = store.get(lid)
        if old is None:
            old = rows.new_zeros((0, rows.shape[1]))
        if old.shape[0] != first:
            raise RuntimeError(f"layer {lid}: compressed entries out of order ({old.shape[0]} != {first})")
        store[lid] = torch.cat([old, rows])

    def _compress(self, u: torch.Tensor, positions: torch.Tensor, role: LayerRole, state: ReferenceState):
        """Returns (new latents bf16 [G, D] pre-RoPE, their first positions int64 [G]) or (None, None)."""
        cfg, lid, r = self.cfg, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        a, b = ops.compressor_project(u, self.w, p, cfg, r)
        if r == 1:
            return a, positions.clone()
        kst = state.comp_kv_state.setdefault(lid, torch.zeros(r, a.shape[1], device=self.device))
        sst = state.comp_score_state.setdefault(lid, torch.full((r, a.shape[1]), float("-inf"), device=self.device))
        latents, starts = [], []
        start = int(positions[0])
        if start == 0:
            n_full = (positions.shape[0] // r) * r
            if n_full:
                G = n_full // r
                latents.append(ops.compressor_pool(a[:n_full].view(G, r, -1), b[:n_full].view(G, r, -1),
                                                   self.w[f"{p}.compressor.norm.weight"], cfg.rms_norm_eps))
                starts.append(torch.arange(G, device=self.device) * r)
            for i in range(n_full, positions.shape[0]):  # trailing partial group goes to the state
                kst[i % r], sst[i % r] = a[i], b[i]
        else:
            pos = start
            kst[pos % r], sst[pos % r] = a[0], b[0]
            if (pos + 1) % r == 0:
                latents.append(ops.compressor_pool(kst[None], sst[None], self.w[f"{p}.compressor.norm.weight"],
                                                   cfg.rms_norm_eps))
                starts.append(torch.tensor([pos + 1 - r], device=self.device))
        if not latents:
            return None, None
        return torch.cat(latents), torch.cat(starts)

    def _indexer(self, qr, u, positions, role: LayerRole, state: ReferenceState, shared: dict, new_latent, group_pos):
        cfg, w, lid, r = self.cfg, self.w, role.layer_id, role.ratio
        p = f"layers.{lid}.attn"
        freqs = self.freqs[lid]
        end = int(positions[-1]) + 1
        if role.mode == LayerMode.FULL:
            if not cfg.index_k_reference_quirk:
                state.index_k_publisher = lid  # intended: the owner always scores against its own keys
            if new_latent is not None:
                keys = ops.index_key_entry(new_latent, group_pos, w, p, cfg, freqs)
                self._append(state.index_k, lid, keys, int(group_pos[0]) // r)
                state.index_k_publisher = lid
        K = state.index_k[state.index_k_publisher][: end // r]
        qi, wts = ops.indexer_queries(qr, u, positions, w, p, cfg, freqs)
        score = indexer_scores_ref(qi, K, wts, (positions + 1) // r)
        if role.is_candidate_source:
            shared["candidates"] = candidate_block_mask_ref(score, end // r, cfg.candidate_block_size,
                                                            cfg.candidate_topk_blocks)
        if role.uses_candidates and shared["candidates"] is not None:
            score = torch.where(shared["candidates"], score, torch.full_like(score, float("-inf")))
        return indexer_topk_ref(score, cfg.index_topk)

