"""The general forward's whole-step index work (model.StepRows) against the per-sequence definitions it replaced.

Since session 80 the window rows, the compressed rows of a selection, the compressor's groups and the Engram look-back
of a prefill (or mixed) step are computed for all rows at once from each row's sequence metadata, not in a loop over
the step's sequences; since session 81 the indexer too (its scores, top-k and candidate blocks, by groups of
sequences). Each test here builds a step of several sequences (fresh ones, ones continuing mid-group, one
decode row), computes the batched result and compares it with the per-sequence definition, written out in the test.
Metric: exact equality (integer indices; cache bytes, the compressor's pooled rows and the selections bit for bit,
on CPU). The
batched writes touch exactly the rows the loops wrote: no sentinel row either.
"""

from __future__ import annotations

import copy

import pytest
import torch
from mini_flashmla import candidate_blocks_of_scores, candidate_positions, indexer_scores, topk_of_scores
from mini_flashmla.cache_layout import pack_compressed_kv_fp4, pack_index_k_fp4

from mini_deepinfer.models.deepseek_v41 import load_model, model as model_module, ops
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.config import LayerMode
from mini_deepinfer.models.deepseek_v41.engram import engram_row_ids
from mini_deepinfer.models.deepseek_v41.model import SeqSpan, StepRows, engram_history_after, true_rows
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

# (context, query) per sequence: fresh, continuing mid-group (odd context at ratio 2), a decode row, a long chunk
STEP = [(0, 5), (37, 3), (130, 1), (0, 1), (66, 140), (3, 9)]
SLOTS = [4, 1, 6, 2, 5, 3]


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random/deepseek-v4.1-flash-1017", "cpu")


def step(model, plan=STEP):
    """A ForwardBatch of the plan's sequences (4 blocks each), its StepTensors, StepRows and SeqSpans."""
    g = torch.Generator().manual_seed(1)
    T = sum(q for _, q in plan)
    tables = [[1 + 4 * i + j for j in range(4)] for i in range(len(plan))]
    batch = ForwardBatch(torch.randint(3, model.config.vocab_size, (T,), generator=g), [q for _, q in plan],
                         [c for c, _ in plan], tables, SLOTS[: len(plan)], [T - 1])
    t = StepTensors.build(batch, model.device)
    spans, start = [], 0
    for i, (c, q) in enumerate(plan):
        spans.append(SeqSpan(i, start, q, c, SLOTS[i], t.block_tables[i]))
        start += q
    return batch, t, StepRows.of_step(t), spans


def test_step_rows_describe_each_rows_sequence(model):
    _, t, rows, spans = step(model)
    for sp in spans:
        r = slice(sp.start, sp.start + sp.qlen)
        assert (rows.seq[r] == sp.index).all() and (rows.slot[r] == sp.slot).all()
        assert (rows.ctx[r] == sp.ctx).all() and (rows.first_pos[r] == sp.ctx).all() and (rows.end[r] == sp.end).all()
        assert rows.pos[r].tolist() == list(range(sp.ctx, sp.end))
    keep = 4
    kept_rows = torch.cat([torch.arange(sp.start + max(0, sp.qlen - keep), sp.start + sp.qlen) for sp in spans])
    kept = rows.kept(kept_rows, keep)
    assert kept.row.tolist() == list(range(kept_rows.shape[0]))
    assert torch.equal(kept.first_pos, torch.maximum(kept.ctx, kept.end - keep))
    assert torch.equal(kept.pos, rows.pos[kept_rows]) and torch.equal(kept.seq, rows.seq[kept_rows])


def test_engram_row_ids_and_history_equal_the_per_sequence_ones(model):
    cfg = model.config
    _, t, rows, spans = step(model)
    compressed = model.token_map[torch.randint(3, cfg.vocab_size, (rows.pos.shape[0],))]
    n_hist = cfg.engram_max_ngram_size - 1
    history = torch.randint(0, cfg.engram_compressed_vocab_size, (len(spans), n_hist))
    history[3] = model.engram_pad  # the fresh sequences' reset history
    history[0] = model.engram_pad
    for li in range(len(cfg.engram_layer_ids)):
        want = torch.cat([engram_row_ids(cfg, li, compressed[sp.rows], model.engram_pad, history=history[sp.index],
                                         multipliers=model.engram_mult[li]) for sp in spans])
        assert torch.equal(model._engram_row_ids(compressed, history, rows, li), want)
    want = torch.stack([torch.cat([history[sp.index], compressed[sp.rows]])[-n_hist:] for sp in spans])
    assert torch.equal(engram_history_after(history, compressed, t.query_starts), want)


@pytest.mark.parametrize("keep", [None, 3])
def test_window_ids_equal_the_per_sequence_ones(model, keep):
    """Past a bounded-replay boundary (keep) the rows are each sequence's last `keep`: positions a replay dropped
    are masked."""
    W = model.config.sliding_window
    _, t, rows, spans = step(model)
    if keep is not None:
        kept_spans, index, start = [], [], 0
        for sp in spans:
            d = max(0, sp.qlen - keep)
            kept_spans.append(SeqSpan(sp.index, start, sp.qlen - d, sp.ctx, sp.slot, sp.block_table, d))
            index.append(torch.arange(sp.start + d, sp.start + sp.qlen))
            start += sp.qlen - d
        index = torch.cat(index)
        spans, rows = kept_spans, rows.kept(index, keep)
    ring = torch.zeros(7 * W, 528, dtype=torch.uint8)
    packed = torch.zeros(rows.pos.shape[0], 528, dtype=torch.uint8)
    _, ids = model._window(packed, rows, spans, t.slots, ring, decode_only=False)
    wpos = ops.window_positions(rows.pos, W)
    want = torch.full_like(wpos, -1)
    for b, sp in enumerate(spans):
        wp = wpos[sp.rows]
        step_row = len(spans) * W + sp.start + (wp - sp.first_pos)
        in_ring = (wp >= 0) & (wp < sp.ctx)
        want[sp.rows] = torch.where(wp >= sp.first_pos, step_row, torch.where(in_ring, b * W + wp % W, -1))
    assert torch.equal(ids, want)


def test_window_writes_keep_each_sequences_last_positions(model):
    W = model.config.sliding_window
    _, _, rows, spans = step(model)
    ring = torch.zeros(7 * W, 528, dtype=torch.uint8)
    packed = torch.randint(0, 256, (rows.pos.shape[0], 528), dtype=torch.uint8)
    model._write_window(packed, rows, spans, ring)
    want = torch.zeros_like(ring)
    for sp in spans:
        keep = slice(sp.start + max(0, sp.qlen - W), sp.start + sp.qlen)
        want[sp.slot * W + rows.pos[keep] % W] = packed[keep]
    assert torch.equal(ring, want)


def compress_per_sequence(model, a, b, spans, role, cache):
    """The compressor's per-sequence loop of sessions <= 79 (model._compress after compressor_project)."""
    cfg, w, lid, r = model.config, model.w, role.layer_id, role.ratio
    p = f"layers.{lid}.attn"
    for sp in spans:
        first_g, end_g = sp.ctx // r, sp.end // r
        if r == 1:
            latent = a[sp.rows]
        elif end_g > first_g:
            kst, sst = cache.comp_kv_state[lid][sp.slot], cache.comp_score_state[lid][sp.slot]
            pos = torch.arange(first_g * r, end_g * r)
            from_step = pos >= sp.ctx
            step_rows = (sp.start + pos - sp.ctx).clamp_min(0)
            kv_g = torch.where(from_step[:, None], a[step_rows], kst[pos % r]).view(-1, r, a.shape[1])
            sc_g = torch.where(from_step[:, None], b[step_rows], sst[pos % r]).view(-1, r, b.shape[1])
            latent = ops.compressor_pool(kv_g, sc_g, w[f"{p}.compressor.norm.weight"], cfg.rms_norm_eps)
        else:
            latent = None
        if r > 1:
            tail = torch.arange(max(sp.ctx, end_g * r), sp.end)
            cache.comp_kv_state[lid][sp.slot, tail % r] = a[sp.start + tail - sp.ctx]
            cache.comp_score_state[lid][sp.slot, tail % r] = b[sp.start + tail - sp.ctx]
        if not cfg.index_k_reference_quirk:
            cache.index_k_publisher[sp.slot] = lid
        if latent is None:
            continue
        groups = torch.arange(first_g, end_g)
        rows = V41Cache.entry_rows(sp.block_table, groups, r)
        freqs = model.freqs[lid]
        cache.compressed_kv[lid][rows] = pack_compressed_kv_fp4(ops.compressed_kv_rotated(latent, groups * r, w, freqs))
        cache.index_k[lid][rows] = pack_index_k_fp4(ops.index_key_rotated(latent, groups * r, w, p, cfg, freqs))
        cache.index_k_publisher[sp.slot] = lid


def test_compressor_writes_equal_the_per_sequence_ones(model):
    """Both FULL layers (ratios 2 and 1): compressed KV and index-key rows, the slots' tails and the publishers, with
    the slots' tails holding random values first."""
    cfg = model.config
    _, t, rows, spans = step(model)
    g = torch.Generator().manual_seed(2)
    u = torch.randn(rows.pos.shape[0], cfg.hidden_size, generator=g).to(torch.bfloat16)
    cache = V41Cache(cfg, num_blocks=4 * len(spans) + 1, num_slots=7)
    for st in list(cache.comp_kv_state.values()) + list(cache.comp_score_state.values()):
        st.copy_(torch.randn(st.shape, generator=g))
    full = [role for role in model.roles if role.mode == LayerMode.FULL]
    assert sorted({role.ratio for role in full}) == [1, 2]
    for role in full:
        a, b = ops.compressor_project(u, model.w, f"layers.{role.layer_id}.attn", cfg, role.ratio)
        want = copy.deepcopy(cache)
        compress_per_sequence(model, a, b, spans, role, want)
        model._compress(u, rows, spans, t, role, cache)
        lid = role.layer_id
        assert torch.equal(cache.compressed_kv[lid], want.compressed_kv[lid])
        assert torch.equal(cache.index_k[lid], want.index_k[lid])
        if role.ratio > 1:
            assert torch.equal(cache.comp_kv_state[lid], want.comp_kv_state[lid])
            assert torch.equal(cache.comp_score_state[lid], want.comp_score_state[lid])
        assert cache.index_k_publisher == want.index_k_publisher
        assert cache.index_k_publisher_device.tolist() == cache.index_k_publisher


def indexer_per_sequence(model, qr, u, spans, role, cache, candidates: dict) -> tuple[torch.Tensor, dict]:
    """The indexer's per-sequence loop of sessions <= 80 (model._indexer; one query slice): (topk int64 [rows,
    index_topk], the candidate source's blocks {sequence: int32 [its rows, kb]})."""
    cfg, r, block = model.config, role.ratio, model.config.candidate_block_size
    positions = torch.cat([torch.arange(sp.first_pos, sp.end) for sp in spans]).to(model.device)
    qi, wts = ops.indexer_queries(qr, u, positions, model.w, f"layers.{role.layer_id}.attn", cfg,
                                  model.freqs[role.layer_id])
    topk = torch.full((positions.shape[0], cfg.index_topk), -1, dtype=torch.int64, device=model.device)
    made = {}
    for sp in spans:
        n_k = sp.end // r
        if n_k == 0:
            continue
        pub = cache.index_k_publisher[sp.slot]
        key_rows = V41Cache.entry_rows(sp.block_table, torch.arange(n_k, device=model.device),
                                       model.roles[pub].ratio).to(torch.int32)
        blocks = candidates.get(sp.index) if role.uses_candidates else None
        score = indexer_scores(qi[sp.rows], wts[sp.rows], cache.index_k[pub], (positions[sp.rows] + 1) // r,
                               key_rows, blocks, block)
        if role.is_candidate_source:
            made[sp.index] = candidate_blocks_of_scores(score, n_k, block, cfg.candidate_topk_blocks)
        sel = topk_of_scores(score, cfg.index_topk)
        if blocks is not None:
            sel = candidate_positions(sel, blocks, block)
        topk[sp.rows, : sel.shape[1]] = sel.long()
    return topk, made


@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return load_model("tiny-random/deepseek-v4.1-flash-1017", "cuda")


@pytest.mark.parametrize("publishers,min_bucket", [("same", 4096), ("mixed", 4096), ("mixed", 1), ("same", 1)])
def test_indexer_equals_the_per_sequence_one(model, publishers, min_bucket, monkeypatch):
    """Every indexer layer of the tiny model in order (ratio-2 FULL, the ratio-1 candidate source, a REINDEX layer
    restricted to its candidates) over a step with a sequence that has no entries yet. Its sequences read one
    publisher's keys or several (the quirk's mix); min_bucket 1 splits them into one group per power of two of their
    entry counts (the default puts these short ones in one). Top-k and candidate blocks bit for bit; the random index
    keys are packed rows."""
    check_indexer_equals_the_per_sequence_one(model, publishers, min_bucket, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("publishers,min_bucket", [("same", 4096), ("mixed", 1)])
def test_indexer_equals_the_per_sequence_one_on_cuda(cuda_model, publishers, min_bucket, monkeypatch):
    """The same on CUDA: the indexer kernels' ragged calls (mini_flashmla's query_starts) against the loop's calls of
    one sequence each, bit for bit (promise 3: a sequence's selection does not depend on what it is batched with)."""
    check_indexer_equals_the_per_sequence_one(cuda_model, publishers, min_bucket, monkeypatch)


def check_indexer_equals_the_per_sequence_one(model, publishers, min_bucket, monkeypatch):
    monkeypatch.setattr(model_module, "INDEXER_MIN_BUCKET_ENTRIES", min_bucket)
    cfg, device = model.config, model.device
    _, t, rows, spans = step(model)
    g = torch.Generator().manual_seed(5)
    T = rows.pos.shape[0]
    qr = torch.randn(T, cfg.q_lora_rank, generator=g).to(torch.bfloat16).to(device)
    u = torch.randn(T, cfg.hidden_size, generator=g).to(torch.bfloat16).to(device)
    cache = V41Cache(cfg, num_blocks=4 * len(spans) + 1, num_slots=7, device=device)
    for keys in cache.index_k.values():
        keys.copy_(pack_index_k_fp4(torch.randn(keys.shape[0], 128, generator=g)))
    full = [role.layer_id for role in model.roles if role.mode == LayerMode.FULL]
    indexers = [role for role in model.roles if role.mode in (LayerMode.FULL, LayerMode.REINDEX)]
    assert any(role.is_candidate_source for role in indexers) and any(role.uses_candidates for role in indexers)
    shared, candidates = {"topk": None, "candidates": None}, {}
    for role in indexers:
        for i, sp in enumerate(spans):
            lid = full[i % len(full)] if publishers == "mixed" and role.ratio > 1 else role.kv_source
            cache.index_k_publisher[sp.slot] = lid
            cache.index_k_publisher_device[sp.slot] = lid
        want, made = indexer_per_sequence(model, qr, u, spans, role, cache, candidates)
        got = model._indexer(qr, u, rows, spans, t, role, cache, shared)
        assert torch.equal(got, want), role.layer_id
        if role.is_candidate_source:
            candidates = made
            for sp in spans:
                kb = made[sp.index].shape[1] if sp.index in made else 0
                assert torch.equal(shared["candidates"][sp.rows, :kb].cpu(),
                                   made.get(sp.index, torch.empty(sp.qlen, 0, dtype=torch.int32)).cpu())
                assert (shared["candidates"][sp.rows, kb:] == -1).all()


def test_true_rows_is_nonzero_of_a_known_count():
    mask = torch.tensor([False, True, True, False, True, False])
    assert true_rows(mask, 3).tolist() == [1, 2, 4]
    assert true_rows(torch.zeros(4, dtype=torch.bool), 0).shape == (0,)


def test_fresh_slots_are_reset_and_only_they(model):
    """A step's fresh sequences (context 0) get the reset state; the others keep theirs."""
    _, t, _, spans = step(model)
    cache = V41Cache(model.config, num_blocks=4 * len(spans) + 1, num_slots=7)
    g = torch.Generator().manual_seed(4)
    for st in list(cache.comp_kv_state.values()) + list(cache.comp_score_state.values()):
        st.copy_(torch.randn(st.shape, generator=g))
    cache.engram_history.copy_(torch.randint(5, 100, cache.engram_history.shape, generator=g))
    cache.index_k_publisher = [2] * 7
    cache.index_k_publisher_device.fill_(2)
    before = copy.deepcopy(cache)
    fresh = [sp.slot for sp in spans if sp.ctx == 0]
    cache.reset_slots(fresh, 9, t.slots[true_rows(t.context_lens == 0, len(fresh))])
    for s in range(7):
        if s in fresh:
            assert (cache.engram_history[s] == 9).all() and cache.index_k_publisher[s] == -1
            assert cache.index_k_publisher_device[s] == -1
            assert all((st[s] == 0).all() for st in cache.comp_kv_state.values())
            assert all((st[s] == float("-inf")).all() for st in cache.comp_score_state.values())
        else:
            assert torch.equal(cache.engram_history[s], before.engram_history[s]) and cache.index_k_publisher[s] == 2
            assert cache.index_k_publisher_device[s] == 2
            assert all(torch.equal(st[s], before.comp_kv_state[k][s]) for k, st in cache.comp_kv_state.items())


def test_slot_0_is_refused_by_a_forward(model):
    batch = ForwardBatch(torch.tensor([5, 6]), [1, 1], [0, 0], [[1], [2]], [3, 0], [0, 1])
    with pytest.raises(ValueError, match="sequence 1 holds state slot 0"):
        model(batch, V41Cache(model.config, num_blocks=3, num_slots=4))
