"""CPU tests of the paged references (the oracles of the kernels and the CPU fallback of the API), the split rule, the
split merge under Triton's interpreter, and the Gluon kernel's dequantization PTX interpreted."""

import math
import types

import pytest
import torch
from mini_deepgemm.reference import fp4_fakequant
from mini_deepgemm.testing import bf16_bits, bf16_halves, finite_e4m3_codes, run_inline_ptx, run_interpreted

import mini_flashmla
from mini_flashmla import api, reference
from mini_flashmla.cache_layout import (
    pack_compressed_kv_fp4,
    pack_index_k_fp4,
    pack_window_fp8,
    unpack_compressed_kv_fp4,
    unpack_index_k_fp4,
    unpack_window_fp8,
)

SCALE = 512**-0.5


def _attn_case(seed: int, s_q: int = 5, h: int = 4, n_w: int = 300, n_c: int = 200, w: int = 128, topk: int = 70):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h, 512, generator=g).bfloat16()
    window_cache = pack_window_fp8(torch.randn(n_w, 512, generator=g))
    compressed_cache = pack_compressed_kv_fp4(torch.randn(n_c, 512, generator=g))
    window_ids = torch.randint(-1, n_w, (s_q, w), generator=g, dtype=torch.int32)
    compressed_ids = torch.randint(-1, n_c, (s_q, topk), generator=g, dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    return q, window_cache, compressed_cache, window_ids, compressed_ids, sink


def test_paged_ref_equals_ref_over_unpacked_cache():
    q, wc, cc, wid, cid, sink = _attn_case(0)
    wid[1] = -1
    cid[1] = -1  # an all-empty row
    kv = torch.cat([unpack_window_fp8(wc), unpack_compressed_kv_fp4(cc)])
    idx = torch.cat([wid, torch.where(cid >= 0, cid + wc.shape[0], -1)], dim=1).to(torch.int32)
    out, lse = reference.sparse_attn_paged_ref(q, wc, cc, wid, cid, SCALE, sink)
    ref_out, ref_lse = reference.sparse_attn_ref(q, kv, idx, SCALE, sink)
    assert torch.equal(out, ref_out)
    assert torch.equal(lse, ref_lse)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()


def test_paged_ref_window_only():
    q, wc, _, wid, _, sink = _attn_case(1)
    out, lse = reference.sparse_attn_paged_ref(q, wc, None, wid, None, SCALE, sink)
    ref_out, ref_lse = reference.sparse_attn_ref(q, unpack_window_fp8(wc), wid, SCALE, sink)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_empty_slots_ignore_nan_in_the_cache():
    """An empty slot contributes nothing whatever the cache holds: NaN in rows that only empty slots would read
    (row 0, which the gathers read for -1) leaves the outputs finite and equal to those with a clean row 0, so one
    sequence's non-finite cache rows cannot reach another sequence's empty slots. A query that selects the row
    reads its own data (the reference then outputs 0 for it: its denominator is NaN); the others stay as they were."""
    q, wc, cc, wid, cid, sink = _attn_case(5)
    wid, cid = torch.where(wid == 0, -1, wid), torch.where(cid == 0, -1, cid)  # empty slots, none on row 0
    nan_wc, nan_cc = wc.clone(), cc.clone()
    nan_wc[0], nan_cc[0] = 0x7F, 0x7F  # e4m3 NaN values (window), an e4m3 NaN scale (compressed)
    assert unpack_window_fp8(nan_wc[:1]).isnan().all() and unpack_compressed_kv_fp4(nan_cc[:1]).isnan().all()
    out, lse = reference.sparse_attn_paged_ref(q, nan_wc, nan_cc, wid, cid, SCALE, sink)
    clean_out, clean_lse = reference.sparse_attn_paged_ref(q, wc, cc, wid, cid, SCALE, sink)
    assert out.isfinite().all() and torch.equal(out, clean_out) and torch.equal(lse, clean_lse)
    wid[2, 5] = 0  # query 2 selects the row
    out, _ = reference.sparse_attn_paged_ref(q, nan_wc, nan_cc, wid, cid, SCALE, sink)
    others = [0, 1, 3, 4]
    assert not torch.equal(out[2], clean_out[2]) and torch.equal(out[others], clean_out[others])


def _indexer_case(seed: int, s_q: int = 6, n_rows: int = 400, n_heads: int = 32):
    g = torch.Generator().manual_seed(seed)
    q = fp4_fakequant(torch.randn(s_q, n_heads, 128, generator=g), 32, "ue8m0").bfloat16()
    weights = (torch.randn(s_q, n_heads, generator=g) * 0.05).bfloat16()
    cache = pack_index_k_fp4(torch.randn(n_rows, 128, generator=g))
    return q, weights, cache


def test_indexer_paged_ref_shared_and_per_query_rows():
    q, w, cache = _indexer_case(2)
    rows = torch.randperm(cache.shape[0])[:250].to(torch.int32)
    visible = torch.tensor([0, 1, 17, 200, 250, 250])
    shared = reference.indexer_scores_paged_ref(q, w, cache, visible, rows)
    ref = reference.indexer_scores_ref(q, unpack_index_k_fp4(cache[rows.long()]), w, visible)
    assert torch.equal(shared, ref)
    per_query = reference.indexer_scores_paged_ref(q, w, cache, visible, rows.expand(q.shape[0], -1).clone())
    assert torch.equal(per_query, ref)
    rows[10] = -1
    assert torch.isneginf(reference.indexer_scores_paged_ref(q, w, cache, visible, rows)[:, 10]).all()


def test_candidate_blocks_are_the_mask_as_ids():
    """candidate_blocks_ref (what the engine keeps) names exactly the blocks candidate_block_mask_ref (the model's
    form) keeps, on scores with many ties and -inf blocks; candidate_entries expands them to ascending positions."""
    g = torch.Generator().manual_seed(3)
    score = torch.tensor([-0.0, 0.5, 1.0])[torch.randint(0, 3, (5, 203), generator=g)]
    score[0] = float("-inf")
    score[1, 40:] = float("-inf")
    for compress_len, topk_blocks in ((203, 7), (0, 7), (100, 26), (203, 40)):
        blocks = reference.candidate_blocks_ref(score, compress_len, 8, topk_blocks)
        assert blocks.shape == (5, min(topk_blocks, 26)) and blocks.dtype == torch.int32
        entries = reference.candidate_entries(blocks, 8)
        mask = torch.zeros(5, 26 * 8 + 1, dtype=torch.bool)  # the last column takes the -1 entries
        mask.scatter_(1, torch.where(entries >= 0, entries, 26 * 8), True)
        assert torch.equal(mask[:, :203], reference.candidate_block_mask_ref(score, compress_len, 8, topk_blocks))
        kept = entries.clamp_min(0)
        assert ((kept[:, 1:] > kept[:, :-1]) | (entries[:, 1:] < 0)).all()  # ascending, then -1


def test_candidate_scores_ref_equal_masked_scores():
    """indexer_scores_candidates_ref: column c of query i is the full score of its c-th candidate entry, -inf for
    -1 blocks and for entries at or past visible / the key list; shared and per-query key rows agree."""
    q, w, cache = _indexer_case(6)
    rows = torch.randperm(cache.shape[0])[:203].to(torch.int32)
    visible = torch.tensor([0, 9, 64, 150, 203, 203])
    full = reference.indexer_scores_paged_ref(q, w, cache, visible, rows)
    blocks = torch.tensor([[0, 3, -1], [0, 1, 2], [1, 7, 25], [5, 18, 24], [2, 25, -1], [-1, -1, -1]],
                          dtype=torch.int32)
    got = reference.indexer_scores_candidates_ref(q, w, cache, visible, rows, blocks, 8)
    entries = reference.candidate_entries(blocks, 8)
    inside = (entries >= 0) & (entries < 203)
    want = torch.where(inside, full.gather(1, entries.clamp(0, 202)), float("-inf"))
    assert torch.equal(got, want)
    per_query = rows.expand(6, -1).clone()
    assert torch.equal(reference.indexer_scores_candidates_ref(q, w, cache, visible, per_query, blocks, 8), got)


@pytest.mark.skipif(api._interpreting(), reason="checks the CPU fallback, which TRITON_INTERPRET replaces")
def test_api_falls_back_to_references_on_cpu():
    q, wc, cc, wid, cid, sink = _attn_case(3)
    assert all(torch.equal(a, b) for a, b in zip(
        mini_flashmla.sparse_mla_fwd_paged(q, wc, cc, wid, cid, SCALE, sink),
        reference.sparse_attn_paged_ref(q, wc, cc, wid, cid, SCALE, sink)))
    kv = unpack_window_fp8(wc)
    assert all(torch.equal(a, b) for a, b in zip(
        mini_flashmla.sparse_mla_fwd(q, kv, wid, SCALE, sink), reference.sparse_attn_ref(q, kv, wid, SCALE, sink)))
    qi, w, cache = _indexer_case(4)
    rows = mini_flashmla.key_range_rows(50, 300, "cpu")
    visible = torch.tensor([3, 40, 100, 150, 299, 300])
    score = reference.indexer_scores_paged_ref(qi, w, cache, visible, rows)
    assert torch.equal(mini_flashmla.indexer_scores(qi, w, cache, visible, rows), score)
    topk = mini_flashmla.indexer_topk(qi, w, cache, visible, rows, 64)
    assert torch.equal(topk, reference.indexer_topk_ref(score, 64))
    blocks = mini_flashmla.candidate_blocks(qi, w, cache, visible, rows, compress_len=300, block=8, topk_blocks=5)
    assert torch.equal(blocks, reference.candidate_blocks_ref(score, 300, 8, 5))
    mask = reference.candidate_block_mask_ref(score, 300, 8, 5)
    restricted = mini_flashmla.indexer_topk(qi, w, cache, visible, rows, 16, candidate_blocks=blocks)
    assert torch.equal(restricted, reference.indexer_topk_ref(score.masked_fill(~mask, float("-inf")), 16))


def test_indexer_topk_is_chunked_by_query(monkeypatch):
    """A tiny chunk budget forces one query per chunk; the result must not change."""
    qi, w, cache = _indexer_case(5)
    rows = mini_flashmla.key_range_rows(0, 400, "cpu")
    visible = torch.tensor([5, 60, 120, 399, 400, 400])
    whole = mini_flashmla.indexer_topk(qi, w, cache, visible, rows, 32)
    monkeypatch.setattr(api, "INDEXER_CHUNK_BYTES", 4 * 400)
    assert api._query_chunk(6, 400) == 1
    assert torch.equal(mini_flashmla.indexer_topk(qi, w, cache, visible, rows, 32), whole)


@pytest.mark.parametrize("programs,splits", [
    (64, 2), (32, 4), (8, 10), (16, 8), (66, 2), (67, 1), (132, 1), (4096, 1), (33, 4), (1, 10),
])
def test_default_decode_splits(monkeypatch, programs, splits):
    """The split rule on a 132-SM GPU at V4.1's 640 slots (10 blocks), for either kernel: every grid below one program
    per SM splits, to about one program per SM, down to one block per split."""
    monkeypatch.setattr(api, "_num_sms", lambda device: 132)
    q = torch.empty(programs, 64, 512)
    assert api._default_num_splits(q, 640) == splits


@pytest.mark.parametrize("n_blocks,asked,expected", [(10, 4, (4, 3)), (10, 3, (3, 4)), (10, 20, (10, 1)),
                                                     (4, 3, (2, 2)), (0, 5, (1, 0)), (7, 1, (1, 7))])
def test_split_blocks_leaves_no_split_empty(n_blocks, asked, expected):
    assert api._split_blocks(n_blocks, asked) == expected


@pytest.mark.parametrize("capability,bf16_rows,heads,want", [
    ((9, 0), True, 64, {"num_warps": 8, "num_stages": 2}),  # the H200's measured launch
    ((10, 0), True, 64, {"num_warps": 8, "num_stages": 1}),  # 2 stages would not fit a B200 program's shared memory
    ((10, 0), False, 64, {"num_warps": 8, "num_stages": 1}),
    ((9, 0), False, 64, {"num_warps": 8, "num_stages": 1}),
    ((10, 0), True, 16, {"num_warps": 4, "num_stages": 1}),
])
def test_attention_launch_by_gpu(capability, bf16_rows, heads, want, monkeypatch):
    """The attention kernel's launch options (api._attn_launch): the H200's for 64-head programs, except bf16 rows
    elsewhere, which take 1 stage (integration_tests/test_compile_sm100.py); a tensor off CUDA (the interpreter) asks
    no device."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    on_gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    assert api._attn_launch(bf16_rows, heads, on_gpu) == want
    assert api._attn_launch(bf16_rows, heads, torch.empty(0)) == (
        api.ATTN_LAUNCH_64_HEADS["bf16" if bf16_rows else "quantized"] if heads == 64 else want)


_MERGE_CHECK = """
import torch
from mini_flashmla import api

g = torch.Generator().manual_seed(0)
for s_q, h, splits in ((3, 64, 4), (2, 128, 2), (2, 4, 5)):
    q = torch.empty(s_q, h, 512, dtype=torch.bfloat16)
    part_out, part_lse = api._split_partials(q, splits)
    part_out.normal_(generator=g)
    part_lse.normal_(generator=g)
    part_lse[0, :, 0] = float("-inf")  # a head with no valid slot in any split
    part_lse[1, 1:, 1] = float("-inf")  # a head with mass in one split only
    sink = torch.randn(h, generator=g)
    sink[2], sink[3] = float("inf"), float("-inf")
    out, lse = torch.empty_like(q), torch.empty(s_q, h)
    api._combine_splits(part_out, part_lse, api._sink_arg(sink, lse), True, out, lse)
    m = part_lse.amax(1)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(part_lse - m[:, None])
    w_sum = w.sum(1)
    ref_lse = torch.where(w_sum > 0, m + torch.log(w_sum), torch.full_like(m, float("-inf")))
    ref = torch.where(w_sum[..., None] > 0, (w[..., None] * part_out).sum(1) / w_sum[..., None], 0.0)
    ref = ref / (1 + torch.exp(sink[None] - ref_lse))[..., None]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf positions"
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max() <= 1e-5, "lse"
    assert (out[0, 0] == 0).all() and (out[:, 2] == 0).all(), "empty heads and +inf sinks give 0"
    assert (out.float() - ref).abs().max() <= 2**-7 * ref.abs().max(), "out"
print("merge ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA runs the merge in the split tests of test_kernels.py")
def test_split_merge_under_the_interpreter():
    """combine_splits_kernel (both kernels' split decode) against a torch merge under TRITON_INTERPRET=1, in a
    subprocess (the interpreter is chosen when the kernels are defined): several head blocks and both head-dim halves
    of the grid, heads with no mass or with mass in one split, +inf and -inf sinks."""
    pytest.importorskip("triton")
    run_interpreted(["-c", _MERGE_CHECK], timeout=600, expect="merge ok")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cache_rows_packed_on_cuda_equal_the_reference_bytes():
    """The three pack functions run mini-deepgemm's quantizer kernels on CUDA: their rows must be the bytes of the
    reference quantizers run on CUDA (act_quant / fp4_quant), here on random rows of scales 1e-3 .. 1e3, bf16 and
    fp32, with an all-zero row."""
    from mini_deepgemm.reference import act_quant, fp4_quant

    g = torch.Generator().manual_seed(11)
    for dtype in (torch.bfloat16, torch.float32):
        kv = (torch.randn(1000, 512, generator=g) * 10 ** (torch.rand(1000, 1, generator=g) * 6 - 3)).to(dtype).cuda()
        k = (torch.randn(1000, 128, generator=g) * 10 ** (torch.rand(1000, 1, generator=g) * 6 - 3)).to(dtype).cuda()
        kv[0], k[0] = 0, 0
        q, s = act_quant(kv, 32, "ue8m0")
        assert torch.equal(pack_window_fp8(kv), torch.cat([q.view(torch.uint8), s.view(torch.uint8)], -1))
        q, s = fp4_quant(kv, 16, "e4m3")
        assert torch.equal(pack_compressed_kv_fp4(kv), torch.cat([q, s.view(torch.uint8)], -1))
        q, s = fp4_quant(k, 32, "ue8m0")
        assert torch.equal(pack_index_k_fp4(k), torch.cat([q, s.view(torch.uint8)], -1))


def _assert_same_bf16(got_words: list[int], want: torch.Tensor, where: str) -> None:
    """bf16 pairs (low half first) against the values `want`: the same bits, or both NaN."""
    for i, (g, w) in enumerate(zip(bf16_halves(got_words), bf16_bits(want))):
        g_nan = torch.tensor([g], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).isnan().item()
        assert g == w or (g_nan and want[i].isnan()), (where, i, hex(g), hex(w))


def test_the_gluon_producers_ptx_decodes_every_code():
    """The Gluon kernel's dequantization PTX (sparse_attn_gluon_kernel._FP8_WORD_PTX and _FP4_WORD_PTX), interpreted
    on the CPU (mini_deepgemm.testing.run_inline_ptx), against the cache's reference unpacking: four rows of each
    format put every e4m3 code and every e2m1 pair at every byte position of a word, under scales from the whole
    range (UE8M0 2^-126 .. 2^13, every finite e4m3). The same bf16 bits, NaN codes NaN. The GPU tests run the
    compiled kernel; this one checks the PTX text itself on every CI run."""
    k = pytest.importorskip("mini_flashmla.sparse_attn_gluon_kernel")
    g = torch.Generator().manual_seed(56)
    position = torch.arange(512)
    ue8m0 = torch.tensor([1, 7, 100, 120, 127, 134, 140], dtype=torch.uint8)
    finite_e4m3 = finite_e4m3_codes()
    for r in range(4):  # code c sits at byte position (c - r) % 4
        codes = ((position + r) % 256).to(torch.uint8)
        window = torch.cat([codes, ue8m0[torch.randint(0, len(ue8m0), (16,), generator=g)]])
        want = unpack_window_fp8(window[None])[0].float()
        words = window[:512].view(torch.int32)
        for i, w in enumerate(words.tolist()):
            pair = int(window[512 + i // 8]) << 7
            got = run_inline_ptx(k._FP8_WORD_PTX.value, [w, pair | pair << 16], 2)
            _assert_same_bf16(got, want[4 * i: 4 * i + 4], f"window row {r} word {i}")
        compressed = torch.cat([codes[:256], finite_e4m3[torch.randint(0, len(finite_e4m3), (32,), generator=g)]])
        want = unpack_compressed_kv_fp4(compressed[None])[0].float()
        scales = bf16_bits(compressed[256:].view(torch.float8_e4m3fn).float())
        for i, w in enumerate(compressed[:256].view(torch.int32).tolist()):
            pair = scales[i // 2] | scales[i // 2] << 16
            got = run_inline_ptx(k._FP4_WORD_PTX.value, [w, pair], 4)
            _assert_same_bf16(got, want[8 * i: 8 * i + 8], f"compressed row {r} word {i}")


def test_the_gluon_producers_layouts_cover_a_chunk_once():
    """Each thread of the Gluon kernel's quantized producer copies exactly the words it converts, in one layout per
    format (_chunk_words), its scale words (SCALE_WORDS) and the groups view of its words: every layout must tile a
    chunk with no element held twice (a layout wider than the chunk replicates it: a window row of 128 words spans
    4 warps laid along it, and 8 would convert every word twice), and both formats' chunks fill one staging size."""
    k = pytest.importorskip("mini_flashmla.sparse_attn_gluon_kernel")

    def assert_tiles_once(layout, shape, what):
        assert math.prod(layout.warps_per_cta) == int(k.PRODUCER_WARPS), what
        assert math.prod(layout.threads_per_warp) == 32, what
        for dim, extent in enumerate(shape):
            span = layout.size_per_thread[dim] * layout.threads_per_warp[dim] * layout.warps_per_cta[dim]
            assert extent % span == 0, f"{what}: dim {dim} of {shape} spans {span}: values held twice"

    chunk_words = set()
    for name, fmt, groups, group_shape in (("window", k.FP8_WINDOW, k.WINDOW_GROUPS, (16, 8)),
                                            ("compressed", k.FP4_COMPRESSED, k.COMPRESSED_GROUPS, (32, 2))):
        rows = int(k._chunk_rows.fn(fmt))
        words, layout = k._chunk_words.fn(fmt)
        assert words == math.prod(group_shape)
        assert_tiles_once(layout, (rows, words), f"{name} words")
        assert_tiles_once(groups, (rows, *group_shape), f"{name} groups")
        assert_tiles_once(k.SCALE_WORDS, (rows, 16), f"{name} scales")
        chunks = int(k.BLOCK_N) // rows
        assert chunks % int(k.STAGES) == 0 and chunks >= int(k.LOOKAHEAD), f"{name}: {chunks} chunks a block"
        chunk_words.add(rows * words)
    assert len(chunk_words) == 1, f"both formats' chunks share the staging buffers' size: {chunk_words} words"


def test_q_for_kernels_copies_only_past_32_bit_head_offsets():
    """api._q_for_kernels: q passes as it is unless a head's offset (head x q.stride(1)) passes 2**31, as in a
    head-major view of 66,577 queries at 64 heads; that one is copied into the contiguous layout (head stride 512).
    Meta tensors: strides and shapes, no memory."""
    for s_q in (66_576, 66_577):
        q = torch.empty(64, s_q, 512, dtype=torch.bfloat16, device="meta").transpose(0, 1)
        out = api._q_for_kernels(q)
        assert (out is q) == (s_q == 66_576)
        assert out.stride() == (q.stride() if s_q == 66_576 else (64 * 512, 512, 1))
    q = torch.empty(10**6, 64, 512, dtype=torch.bfloat16, device="meta")  # contiguous: any s_q passes as it is
    assert api._q_for_kernels(q) is q


def test_launch_views_keep_32_bit_offsets():
    """api._rows_per_launch and _launch_views: the tensors as they are where one launch holds every query (no views:
    the common call pays no slicing), else consecutive chunks whose largest query offset stays below 2**31."""
    ids = torch.empty(16_386, 2**17, dtype=torch.int32, device="meta")
    rows = api._rows_per_launch(ids.stride(0), 1)
    assert rows == 16_383 and (rows - 1) * ids.stride(0) + ids.shape[1] - 1 <= 2**31 - 1
    out = torch.empty(16_386, 8, device="meta")
    chunks = api._launch_views(rows, ids, out)
    assert [c[0].shape[0] for c in chunks] == [16_383, 3] and [c[1].shape[0] for c in chunks] == [16_383, 3]
    whole = api._launch_views(16_386, ids, out)
    assert len(whole) == 1 and whole[0][0] is ids and whole[0][1] is out
