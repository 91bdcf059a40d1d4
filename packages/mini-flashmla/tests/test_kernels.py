"""Kernels against the pure-torch references on random data (GPU only). Triton's interpreter (TRITON_INTERPRET=1)
multiplies the raw bit patterns of bf16 tl.dot operands (triton-lang/triton#11584; upstream does not support bf16
there), so every kernel here gives wrong values under it (checked with the uv-locked triton 3.9: 19 of 19 failed)
and the module skips itself there.

Metrics
- attention out: relative L2 error ||o - r|| / ||r|| <= 5e-3 and max |o - r| <= 2^-6 * max|r| (bf16 output
  rounding plus the MMA's summation order; split decode also rounds P against a different running max, and each
  split's output to bf16 before the merge); rows whose slots are all empty must be exactly 0 with lse exactly -inf.
- attention lse: |lse - ref| <= 1e-4 (fp32 on both sides), -inf positions identical.
- quantized reads: a query with a single valid slot returns that row's dequantized value bit for bit.
- indexer scores: identical to the reference except at most 0.1% of the entries, each within one bf16 ulp (the
  32-head fp32 sum may be ordered differently); -inf positions identical.
- top-k: tie-aware, the multiset of reference scores of the chosen keys is identical.
"""


import os

import pytest
import torch
from mini_deepgemm.reference import fp4_fakequant
from mini_deepgemm.testing import finite_e4m3_codes

import mini_flashmla
from mini_flashmla import api, reference
from mini_flashmla.cache_layout import (
    pack_compressed_kv_fp4,
    pack_index_k_fp4,
    pack_window_fp8,
    unpack_compressed_kv_fp4,
    unpack_window_fp8,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="triton's interpreter does not support bf16 tl.dot (triton-lang/triton#11584)")]
SCALE = 512**-0.5


def assert_attn_close(out, lse, ref_out, ref_lse):
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse -inf positions differ"
    assert (out[empty] == 0).all(), "all-empty rows must be exactly 0"
    if (~empty).any():
        assert (lse[~empty] - ref_lse[~empty]).abs().max().item() <= 1e-4
    o, r = out.float(), ref_out.float()
    rel_l2 = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    max_abs = (o - r).abs().max().item()
    assert rel_l2 <= 5e-3, f"relative L2 {rel_l2:.3e}"
    assert max_abs <= 2**-6 * r.abs().max().item() + 1e-6, f"max abs {max_abs:.3e}"


def _random_ids(g, s_q, n, n_rows, empty_frac=0.2, device="cpu"):
    ids = torch.randint(0, n_rows, (s_q, n), generator=g, dtype=torch.int32)
    ids[torch.rand(s_q, n, generator=g) < empty_frac] = -1
    return ids.to(device)


@pytest.mark.parametrize("s_q,h,n_kv,topk",
                         [(4, 4, 300, 64), (3, 64, 1000, 640), (2, 128, 500, 100), (5, 16, 40, 128)])
def test_sparse_mla_fwd_bf16(device, s_q, h, n_kv, topk):
    g = torch.Generator().manual_seed(s_q * 1000 + h)
    q = torch.randn(s_q, h, 512, generator=g).bfloat16().to(device)
    kv = torch.randn(n_kv, 512, generator=g).bfloat16().to(device)
    idx = _random_ids(g, s_q, topk, n_kv, device=device)
    idx[0, :] = -1  # all-empty row
    idx[1, : topk // 2] = idx[1, topk // 2 : 2 * (topk // 2)]  # duplicates
    sink = torch.randn(h, generator=g).to(device)
    out, lse = mini_flashmla.sparse_mla_fwd(q, kv, idx, SCALE, sink)
    assert_attn_close(out, lse, *reference.sparse_attn_ref(q, kv, idx, SCALE, sink))
    out, lse = mini_flashmla.sparse_mla_fwd(q, kv, idx, SCALE)  # no sink
    assert_attn_close(out, lse, *reference.sparse_attn_ref(q, kv, idx, SCALE))


def test_sparse_mla_fwd_sink_extremes_and_out_of_range_ids(device):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, 4, 512, generator=g).bfloat16().to(device)
    kv = torch.randn(50, 512, generator=g).bfloat16().to(device)
    idx = _random_ids(g, 3, 64, 50, device=device)
    sink = torch.tensor([float("inf"), float("-inf"), 0.0, 3.0], device=device)
    out, lse = mini_flashmla.sparse_mla_fwd(q, kv, idx, SCALE, sink)
    ref_out, ref_lse = reference.sparse_attn_ref(q, kv, idx, SCALE, sink)
    assert (out[:, 0] == 0).all()  # +inf sink takes all the mass
    assert_attn_close(out, lse, ref_out, ref_lse)
    bad = idx.clone()
    outside = torch.tensor([50, 10**6, -(2**31)], dtype=torch.int32, device=device)  # n_kv, far, int32 min
    bad[:, ::3] = outside.repeat(22)[: bad[:, ::3].shape[1]]
    out_bad, lse_bad = mini_flashmla.sparse_mla_fwd(q, kv, bad, SCALE, sink)
    clean = torch.where((bad >= 0) & (bad < 50), bad, -1)
    assert_attn_close(out_bad, lse_bad, *reference.sparse_attn_ref(q, kv, clean, SCALE, sink))


def _paged_case(g, s_q, h, n_w_rows, n_c_rows, w, topk, device):
    q = torch.randn(s_q, h, 512, generator=g).bfloat16().to(device)
    window_cache = pack_window_fp8(torch.randn(n_w_rows, 512, generator=g) * 3).to(device)
    compressed_cache = pack_compressed_kv_fp4(torch.randn(n_c_rows, 512, generator=g)).to(device)
    window_ids = _random_ids(g, s_q, w, n_w_rows, device=device)
    compressed_ids = _random_ids(g, s_q, topk, n_c_rows, device=device)
    sink = torch.randn(h, generator=g).to(device)
    return q, window_cache, compressed_cache, window_ids, compressed_ids, sink


@pytest.mark.parametrize("s_q,h,w,topk,num_splits", [
    (6, 64, 128, 512, 1),  # V4.1 prefill shape (smaller s_q)
    (6, 64, 128, 512, None),  # decode: automatic split
    (5, 4, 128, 100, 3),  # tiny model heads, ragged topk, explicit split
    (4, 8, 100, 30, 2),  # window not a multiple of 64, s_kv < topk style short lists
])
def test_sparse_mla_fwd_paged(device, s_q, h, w, topk, num_splits):
    g = torch.Generator().manual_seed(s_q * 7 + h + topk)
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, h, 400, 300, w, topk, device)
    wid[0], cid[0] = -1, -1  # all-empty row
    cid[1] = -1  # window only for this query
    wid[2] = -1  # compressed only for this query
    out, lse = mini_flashmla.sparse_mla_fwd_paged(q, wc, cc, wid, cid, SCALE, sink, num_splits=num_splits)
    assert_attn_close(out, lse, *reference.sparse_attn_paged_ref(q, wc, cc, wid, cid, SCALE, sink))


def test_sparse_mla_fwd_paged_window_only(device):
    g = torch.Generator().manual_seed(11)
    q, wc, _, wid, _, sink = _paged_case(g, 4, 4, 256, 1, 128, 1, device)
    out, lse = mini_flashmla.sparse_mla_fwd_paged(q, wc, None, wid, None, SCALE, sink)
    assert_attn_close(out, lse, *reference.sparse_attn_paged_ref(q, wc, None, wid, None, SCALE, sink))


def _check_quantized_reads(run, h, n_compressed_slots, compressed_slot, seed, device):
    """One valid slot per query: run(q, wc, cc, window_ids, compressed_ids) must return exactly that row's dequantized
    value (P = 1, no sink), for a window row and for a compressed row."""
    g = torch.Generator().manual_seed(seed)
    s_q = 64
    q, wc, cc, _, _, _ = _paged_case(g, s_q, h, 64, 64, 1, 1, device)
    empty_w = torch.full((s_q, 128), -1, dtype=torch.int32, device=device)
    empty_c = torch.full((s_q, n_compressed_slots), -1, dtype=torch.int32, device=device)
    rows = torch.arange(s_q, dtype=torch.int32, device=device)
    wid = empty_w.clone()
    wid[:, 77] = rows
    out = run(q, wc, cc, wid, empty_c)
    assert torch.equal(out, unpack_window_fp8(wc)[:, None, :].expand_as(out))
    cid = empty_c.clone()
    cid[:, compressed_slot] = rows
    out = run(q, wc, cc, empty_w, cid)
    assert torch.equal(out, unpack_compressed_kv_fp4(cc)[:, None, :].expand_as(out))


def test_quantized_reads_are_bit_exact(device):
    def run(q, wc, cc, wid, cid):
        return mini_flashmla.sparse_mla_fwd_paged(q, wc, cc, wid, cid, SCALE, None, num_splits=1)[0]

    _check_quantized_reads(run, 4, 64, 5, 12, device)


# --------------------------------------------------------------------------- the Gluon paged kernel (sm_90, triton 3.6)
# sparse_attn_gluon_kernel.py: the public API routes unsplit calls of whole 64-head programs there; these tests call
# it directly and check it against the reference and the Triton kernel, with the metrics above.


@pytest.fixture(scope="module")
def gluon_device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q = torch.empty(1, 64, 512, dtype=torch.bfloat16, device="cuda").expand(1024, -1, -1)  # enough programs
    if not api._gluon_runs_on(q, torch.empty(1, 528, dtype=torch.uint8, device="cuda")):
        pytest.skip("the Gluon kernel needs sm_90 and triton 3.6")
    return "cuda"


def _paged_sources(wc, cc, wid, cid):
    from mini_flashmla.sparse_attn_kernel import FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW

    return (wc, wid, FORMAT_FP8_WINDOW.value), (cc, cid, FORMAT_FP4_COMPRESSED.value) if cc is not None else None


def _gluon_paged(q, wc, cc, wid, cid, sink):
    return api._launch_gluon(q, *_paged_sources(wc, cc, wid, cid), SCALE, sink)


@pytest.mark.parametrize("s_q,h,n_w,n_c,w,topk", [
    (6, 64, 400, 300, 128, 512),  # V4.1 prefill slots: 2 window + 8 compressed blocks
    (5, 128, 50, 40, 100, 70),  # two head programs; partial blocks; fewer rows than slots
    (3, 64, 1000, 2000, 64, 640),  # one window block, ten compressed
    (4, 64, 300, 300, 1, 1),  # one slot per source
])
def test_gluon_paged_matches_reference_and_triton(gluon_device, s_q, h, n_w, n_c, w, topk):
    g = torch.Generator().manual_seed(s_q * 31 + h + topk)
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, h, n_w, n_c, w, topk, gluon_device)
    wid[0], cid[0] = -1, -1  # all-empty row
    cid[1] = -1  # window only
    wid[2] = -1  # compressed only
    if topk > 1:
        cid[s_q - 1, : topk // 2] = cid[s_q - 1, 0]  # duplicates
        outside = torch.tensor([n_c, 10**6, -(2**31), -5], dtype=torch.int32, device=gluon_device)
        cid[s_q - 1, topk // 2 :: 5] = outside.repeat(topk)[: cid[s_q - 1, topk // 2 :: 5].numel()]
    for with_sink in (True, False):
        s = sink if with_sink else None
        out, lse = _gluon_paged(q, wc, cc, wid, cid, s)
        clean = torch.where((cid >= 0) & (cid < n_c), cid, -1)
        ref_out, ref_lse = reference.sparse_attn_paged_ref(q, wc, cc, wid, clean, SCALE, s)
        assert_attn_close(out, lse, ref_out, ref_lse)
        tri_out, tri_lse = api._launch_sparse_attn(q, *_paged_sources(wc, cc, wid, cid), SCALE, s, 1)
        assert_attn_close(out, lse, tri_out.float(), tri_lse)
        again, _ = _gluon_paged(q, wc, cc, wid, cid, s)
        assert torch.equal(out, again), "not deterministic"


# The consumer warpgroups take blocks in pairs; an odd count ends with one block (here, a 1-slot window: the only one)
@pytest.mark.parametrize("w", [128, 1])
def test_gluon_paged_window_only_and_sink_extremes(gluon_device, w):
    g = torch.Generator().manual_seed(5)
    q, wc, _, wid, _, _ = _paged_case(g, 4, 64, 256, 1, w, 1, gluon_device)
    sink = torch.randn(64, generator=g).to(gluon_device)
    sink[:3] = torch.tensor([float("inf"), float("-inf"), 0.0])
    out, lse = _gluon_paged(q, wc, None, wid, None, sink)
    assert (out[:, 0] == 0).all()  # +inf sink takes all the mass
    assert_attn_close(out, lse, *reference.sparse_attn_paged_ref(q, wc, None, wid, None, SCALE, sink))


# Blocks: 2 window + 8 compressed (5 pairs); 1 window + 2 compressed (an odd count: the last block alone)
@pytest.mark.parametrize("w,topk", [(128, 512), (64, 100)])
def test_gluon_trace_keeps_the_outputs_and_orders_every_partitions_events(gluon_device, w, topk):
    from mini_flashmla import sparse_attn_gluon_kernel as kernel

    HEADER, PAIR_EVENTS, TRACE_EVENTS, TRACE_ROLES = (c.value for c in (kernel.HEADER, kernel.PAIR_EVENTS,
                                                                         kernel.TRACE_EVENTS, kernel.TRACE_ROLES))
    g = torch.Generator().manual_seed(w + topk)
    s_q, h = 300, 128  # more programs than SMs: some SMs run two
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, h, 400, 300, w, topk, gluon_device)
    sources = _paged_sources(wc, cc, wid, cid)
    trace = torch.full((s_q * h // 64, TRACE_ROLES, TRACE_EVENTS), -1, dtype=torch.int64, device=gluon_device)
    out, lse = api._launch_gluon(q, *sources, SCALE, sink)
    traced_out, traced_lse = api._launch_gluon(q, *sources, SCALE, sink, 1, trace)
    assert torch.equal(out, traced_out) and torch.equal(lse, traced_lse)
    trace = trace.cpu()
    n_blocks = (w + 63) // 64 + (topk + 63) // 64
    pairs, last = divmod(n_blocks, 2)
    wg0 = [p * PAIR_EVENTS + e for p in range(pairs) for e in range(6)] + [pairs * PAIR_EVENTS + e for e in
                                                                           range(4 * last)]
    wg1 = [p * PAIR_EVENTS + e for p in range(pairs) for e in range(5)] + [pairs * PAIR_EVENTS + e for e in
                                                                           (0, 4)[: 2 * last]]
    producer = list(range(2 * n_blocks))
    sms = torch.cuda.get_device_properties(gluon_device).multi_processor_count
    assert ((trace[:, HEADER, 0] >= 0) & (trace[:, HEADER, 0] < sms)).all()
    start, end = trace[:, HEADER, 1:2], trace[:, HEADER, 2:3]
    for role, events in ((0, wg0), (1, wg1), (2, producer)):
        clocks = trace[:, role, events]
        assert (clocks.diff(dim=1) >= 0).all(), f"role {role}: events out of order"
        assert ((clocks >= start) & (clocks <= end)).all() or role == 2  # the producer may finish after wg0
    # causality across partitions (one SM clock): block 0's and 1's tiles were free to the producer before a
    # consumer found them in, and warpgroup 0 finished its softmax (then published P) before warpgroup 1 adopted it
    assert (trace[:, 2, 0] <= trace[:, 0, 0]).all() and (trace[:, 2, 2] <= trace[:, 1, 1]).all()
    assert (trace[:, 0, 2] <= trace[:, 1, 0]).all()


def test_gluon_quantized_reads_are_bit_exact(gluon_device):
    _check_quantized_reads(lambda *rows: _gluon_paged(*rows, None)[0], 64, 512, 300, 13, gluon_device)


def test_gluon_window_reads_every_e4m3_code(gluon_device):
    """Window rows built byte by byte: every finite e4m3 code (subnormals, both zeros) in every row, under UE8M0
    scales from 2^-126 (bf16 subnormal products) to 2^13. A query with that row as its only slot returns the row's
    dequantization bit for bit (P = 1, no sink). A row holding the NaN code (what pack_window_fp8 writes for a NaN
    input) must not read as finite data: its query's output is NaN or, as for a row of no valid slot, zero."""
    g = torch.Generator().manual_seed(55)
    finite = finite_e4m3_codes()  # 254 codes
    rows = 64
    codes = torch.stack([finite[torch.randperm(254, generator=g)].repeat(3)[:512] for _ in range(rows)])
    exponents = torch.tensor([1, 2, 7, 60, 100, 119, 120, 121, 125, 127, 130, 134, 135, 140], dtype=torch.uint8)
    scales = exponents[torch.randint(0, len(exponents), (rows, 16), generator=g)]
    codes[rows - 1, 5] = 0x7F  # the last row holds a NaN code
    wc = torch.cat([codes, scales], dim=1).to(gluon_device)
    q = (torch.randn(rows, 64, 512, generator=g) * 1e-3).bfloat16().to(gluon_device)
    wid = torch.full((rows, 128), -1, dtype=torch.int32, device=gluon_device)
    wid[:, 40] = torch.arange(rows, dtype=torch.int32, device=gluon_device)
    out = _gluon_paged(q, wc, None, wid, None, None)[0]
    expected = unpack_window_fp8(wc)[:, None, :].expand_as(out)
    assert torch.equal(out[: rows - 1], expected[: rows - 1])
    nan_row = out[rows - 1]
    assert torch.isnan(nan_row).any() or (nan_row == 0).all(), "a NaN code read as finite data"


def test_gluon_compressed_reads_every_e2m1_pair(gluon_device):
    """Compressed rows built byte by byte: each row's 256 value bytes a permutation of all 256 e2m1 pairs (so every
    pair at every byte position of a word over the rows), under e4m3 scales drawn from every finite code, negative
    and subnormal ones too (every product is exact in bf16). A query with that row as its only slot returns the
    row's dequantization bit for bit."""
    g = torch.Generator().manual_seed(56)
    rows = 64
    codes = torch.stack([torch.randperm(256, generator=g) for _ in range(rows)]).to(torch.uint8)
    finite = finite_e4m3_codes()
    scales = finite[torch.randint(0, len(finite), (rows, 32), generator=g)]
    cc = torch.cat([codes, scales], dim=1).to(gluon_device)
    q = (torch.randn(rows, 64, 512, generator=g) * 1e-3).bfloat16().to(gluon_device)
    cid = torch.full((rows, 512), -1, dtype=torch.int32, device=gluon_device)
    cid[:, 300] = torch.arange(rows, dtype=torch.int32, device=gluon_device)
    empty_w = torch.full((rows, 128), -1, dtype=torch.int32, device=gluon_device)
    wc = torch.zeros(1, 528, dtype=torch.uint8, device=gluon_device)
    out = _gluon_paged(q, wc, cc, empty_w, cid, None)[0]
    assert torch.equal(out, unpack_compressed_kv_fp4(cc)[:, None, :].expand_as(out))


# Split decode on the Gluon kernel: each split walks its own blocks (window then compressed, as one walk) and writes
# bf16 partials that combine_splits_kernel merges. Block counts per split: odd (warpgroup 0 ends alone) and even, a
# split across the window / compressed boundary, one that starts inside the compressed list, one-block splits.
@pytest.mark.parametrize("s_q,h,n_w,n_c,w,topk,num_splits", [
    (4, 64, 400, 300, 128, 512, 2),  # V4.1 decode slots: 10 blocks, 5 per split (split 1 all compressed)
    (4, 64, 400, 300, 128, 512, 4),  # 3 / 3 / 3 / 1 blocks: split 0 crosses into the compressed list
    (3, 128, 1000, 2000, 64, 640, 11),  # one block per split; two head programs
    (5, 64, 50, 40, 100, 70, 3),  # partial blocks: 2 window + 2 compressed, 2 splits of 2
])
def test_gluon_split_matches_reference_and_unsplit(gluon_device, s_q, h, n_w, n_c, w, topk, num_splits):
    g = torch.Generator().manual_seed(s_q * 17 + h + topk + num_splits)
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, h, n_w, n_c, w, topk, gluon_device)
    wid[0], cid[0] = -1, -1  # all-empty row: every split empty
    cid[1] = -1  # window only: the compressed-only splits are empty
    wid[2] = -1  # compressed only
    cid[s_q - 1, : topk // 2] = cid[s_q - 1, 0]  # duplicates
    cid[s_q - 1, topk // 2 :: 7] = n_c + 5  # outside the cache
    clean = torch.where((cid >= 0) & (cid < n_c), cid, -1)
    sources = _paged_sources(wc, cc, wid, cid)
    for s in (sink, None):
        out, lse = api._launch_gluon(q, *sources, SCALE, s, num_splits)
        assert_attn_close(out, lse, *reference.sparse_attn_paged_ref(q, wc, cc, wid, clean, SCALE, s))
        unsplit_out, unsplit_lse = api._launch_gluon(q, *sources, SCALE, s)
        assert_attn_close(out, lse, unsplit_out.float(), unsplit_lse)
        again, _ = api._launch_gluon(q, *sources, SCALE, s, num_splits)
        assert torch.equal(out, again), "not deterministic"


def test_public_api_routes_64_head_calls_to_gluon(gluon_device, monkeypatch):
    """The public calls take the Gluon kernel for whole 64-head programs, split (decode: fewer programs than SMs) or
    not, else the Triton kernel (the two give the same results within the tolerances above, so this spies on the
    launcher and the split count it gets)."""
    g = torch.Generator().manual_seed(3)
    s_q = torch.cuda.get_device_properties(gluon_device).multi_processor_count  # one program per SM
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, 64, 100, 100, 128, 640, gluon_device)
    splits = []
    launch = api._launch_gluon
    monkeypatch.setattr(api, "_launch_gluon", lambda *a: splits.append(a[5] if len(a) > 5 else 1) or launch(*a))
    api.sparse_mla_fwd_paged(q, wc, cc, wid, cid, SCALE, sink)  # one program per SM: unsplit
    api.sparse_mla_fwd_paged(q, wc, cc, wid, cid, SCALE, sink, num_splits=2)
    api.sparse_mla_fwd_paged(q[:40], wc, cc, wid[:40], cid[:40], SCALE, sink)  # < 1 per SM: split to fill the SMs
    assert splits == [1, 2, s_q // 40]
    api.sparse_mla_fwd_paged(q[:, :16].contiguous(), wc, cc, wid, cid, SCALE, sink[:16])  # 16 heads: Triton
    empty_ids = _random_ids(g, s_q, 8, 1, empty_frac=1.0, device=gluon_device)
    out, lse = api.sparse_mla_fwd_paged(q, wc, cc[:0], wid, empty_ids, SCALE, sink)  # no compressed rows: Triton
    assert len(splits) == 3 and torch.isfinite(lse).all()
    kv = torch.randn(300, 512, generator=g).bfloat16().to(gluon_device)
    api.sparse_mla_fwd(q, kv, _random_ids(g, s_q, 64, 300, device=gluon_device), SCALE, sink)  # bf16 rows
    assert splits == [1, 2, s_q // 40, 1]


@pytest.mark.parametrize("s_q,h,n_kv,topk", [(37, 64, 1000, 640), (19, 128, 50, 100), (5, 64, 3, 64), (4, 64, 9, 1)])
def test_gluon_bf16_rows_match_reference_and_triton(gluon_device, s_q, h, n_kv, topk):
    from mini_flashmla.sparse_attn_kernel import FORMAT_BF16

    g = torch.Generator().manual_seed(s_q + h + topk)
    q = torch.randn(s_q, h, 512, generator=g).bfloat16().to(gluon_device)
    kv = torch.randn(n_kv, 512, generator=g).bfloat16().to(gluon_device)
    idx = torch.randint(-1, n_kv + 3, (s_q, topk), generator=g, dtype=torch.int32).to(gluon_device)  # past the end too
    idx[0] = -1  # all-empty row
    idx[1, : topk // 2] = idx[1, 0]  # duplicates
    sink = torch.randn(h, generator=g).to(gluon_device)
    clean = torch.where(idx < n_kv, idx, -1)
    for s in (sink, None):
        out, lse = api._launch_gluon(q, (kv, idx, FORMAT_BF16.value), None, SCALE, s)
        assert_attn_close(out, lse, *reference.sparse_attn_ref(q, kv, clean, SCALE, s))
        tri_out, tri_lse = api._launch_sparse_attn(q, (kv, idx, FORMAT_BF16.value), None, SCALE, s, 1)
        assert_attn_close(out, lse, tri_out.float(), tri_lse)


@pytest.mark.parametrize("h", [64, 128])
def test_gluon_running_max_rising_falling_and_flat(gluon_device, h):
    """Scores built to change by a set amount per 64-slot block, per head (log2 units): 0, 3, 12 and -5, so the
    running max of one block moves a little for some rows, a lot for others and not at all for the rest; blocks in
    rising order, in random orders and with empty slots. Against the reference and the Triton kernel. (Session 65 ran
    it against a kernel that moved a row's max only past 8 and skipped the rescale otherwise: negative, reverted.)"""
    from mini_flashmla.sparse_attn_kernel import FORMAT_BF16

    g = torch.Generator().manual_seed(h)
    s_q, topk = 6, 640  # ten blocks
    u = torch.nn.functional.normalize(torch.randn(512, generator=g), dim=0)
    rise = torch.tensor([0.0, 3.0, 12.0, -5.0]).repeat(h // 4)[torch.randperm(h, generator=g)]
    q = (rise / (SCALE * 1.4426950408889634))[None, :, None] * u + 0.05 * torch.randn(s_q, h, 512, generator=g)
    kv = (torch.arange(topk) // 64).float()[:, None] * u + 0.01 * torch.randn(topk, 512, generator=g)
    idx = torch.stack([torch.randperm(topk, generator=g) for _ in range(s_q)]).int()
    idx[0] = torch.arange(topk)  # blocks in rising order
    idx[1, ::3] = -1
    q, kv, idx = q.bfloat16().to(gluon_device), kv.bfloat16().to(gluon_device), idx.to(gluon_device)
    sink = torch.randn(h, generator=g).to(gluon_device)
    for s in (sink, None):
        out, lse = api._launch_gluon(q, (kv, idx, FORMAT_BF16.value), None, SCALE, s)
        assert_attn_close(out, lse, *reference.sparse_attn_ref(q, kv, idx, SCALE, s))
        tri_out, tri_lse = api._launch_sparse_attn(q, (kv, idx, FORMAT_BF16.value), None, SCALE, s, 1)
        assert_attn_close(out, lse, tri_out.float(), tri_lse)


def _both_kernels_match_on_rows(q, kv, idx, sink, rows):
    """The public call (the Gluon kernel at 64 heads on sm_90) and the Triton kernel, each on the whole call, against
    the reference on `rows` only (the calls below are too large for the reference)."""
    from mini_flashmla.sparse_attn_kernel import FORMAT_BF16

    ref_out, ref_lse = reference.sparse_attn_ref(q[rows], kv, idx[rows], SCALE, sink)
    for launch in (lambda: mini_flashmla.sparse_mla_fwd(q, kv, idx, SCALE, sink),
                   lambda: api._launch_sparse_attn(q, (kv, idx, FORMAT_BF16.value), None, SCALE, sink, 1)):
        out, lse = launch()
        assert_attn_close(out[rows], lse[rows], ref_out, ref_lse)
        del out, lse


def test_outputs_past_2_31_elements(gluon_device):
    """s_q = 65,536 + 8 at 64 heads: q and out hold more than 2**31 elements, so a query's offset sq * (64 x 512)
    must be 64-bit (in int32 row 65,536 wrapped to a negative offset). Both kernels, rows on either side of it."""
    g = torch.Generator(device=gluon_device).manual_seed(23)
    s_q, h, n_kv, topk = 65_536 + 8, 64, 300, 64
    q = torch.randn(s_q, h, 512, generator=g, device=gluon_device, dtype=torch.bfloat16)
    kv = torch.randn(n_kv, 512, generator=g, device=gluon_device, dtype=torch.bfloat16)
    idx = torch.randint(-1, n_kv, (s_q, topk), generator=g, device=gluon_device, dtype=torch.int32)
    sink = torch.randn(h, generator=g, device=gluon_device)
    rows = torch.tensor([0, 1, 65_534, 65_535, 65_536, 65_537, s_q - 1], device=gluon_device)
    _both_kernels_match_on_rows(q, kv, idx, sink, rows)


def test_head_major_q_past_2_31_elements(gluon_device):
    """A head-major q (x[h, s_q, 512].transpose(0, 1), head stride 512 s_q) of 66,580 queries: head 63's offset
    passes 2**31, which both kernels form in 32 bits, so the API copies such a q into the contiguous layout
    (api._q_for_kernels). Both kernels, every head of rows at both ends."""
    g = torch.Generator(device=gluon_device).manual_seed(29)
    s_q, h, n_kv, topk = 66_580, 64, 300, 64
    q = torch.randn(h, s_q, 512, generator=g, device=gluon_device, dtype=torch.bfloat16).transpose(0, 1)
    assert q.stride(1) * (h - 1) > 2**31
    kv = torch.randn(n_kv, 512, generator=g, device=gluon_device, dtype=torch.bfloat16)
    idx = torch.randint(-1, n_kv, (s_q, topk), generator=g, device=gluon_device, dtype=torch.int32)
    sink = torch.randn(h, generator=g, device=gluon_device)
    rows = torch.tensor([0, 1, s_q - 2, s_q - 1], device=gluon_device)
    _both_kernels_match_on_rows(q, kv, idx, sink, rows)


def test_ids_offsets_past_2_31_elements(gluon_device):
    """16,386 queries of 131,072 slots: the ids hold more than 2**31 elements, and both kernels form a query's ids
    offset (sq x topk) in 32 bits, so the API launches them on chunks of queries that keep it below (the last
    query's wrapped in one launch). Both kernels, source A's ids (source B's stride takes part in the same rule)."""
    g = torch.Generator(device=gluon_device).manual_seed(31)
    topk, n_kv = 2**17, 300
    s_q = 2**31 // topk + 2
    q = torch.randn(s_q, 64, 512, generator=g, device=gluon_device, dtype=torch.bfloat16)
    kv = torch.randn(n_kv, 512, generator=g, device=gluon_device, dtype=torch.bfloat16)
    idx = torch.randint(-1, n_kv, (s_q, topk), generator=g, device=gluon_device, dtype=torch.int32)
    sink = torch.randn(64, generator=g, device=gluon_device)
    rows = torch.tensor([0, s_q - 2, s_q - 1], device=gluon_device)
    assert (s_q - 1) * topk > 2**31
    _both_kernels_match_on_rows(q, kv, idx, sink, rows)


@pytest.mark.parametrize("h", [64, 16])  # the Gluon kernel where it runs (64 heads), the Triton kernel (16)
def test_empty_slots_ignore_nan_in_the_cache(gluon_device, h):
    """An empty slot contributes nothing whatever the cache holds, on every path: with NaN in row 0 (which empty
    slots were read as) and no query selecting it, the outputs equal those with a clean row 0 bit for bit. So one
    sequence's non-finite cache rows cannot reach another sequence's empty slots."""
    g = torch.Generator().manual_seed(29)
    s_q, n_kv, n_w, n_c, w, topk = 6, 300, 400, 300, 128, 512
    q, wc, cc, wid, cid, sink = _paged_case(g, s_q, h, n_w, n_c, w, topk, gluon_device)
    kv = torch.randn(n_kv, 512, generator=g).bfloat16().to(gluon_device)
    idx = _random_ids(g, s_q, topk, n_kv, device=gluon_device)
    idx, wid, cid = (torch.where(ids == 0, -1, ids) for ids in (idx, wid, cid))  # empty slots, none on row 0
    nan_kv, nan_wc, nan_cc = kv.clone(), wc.clone(), cc.clone()
    nan_kv[0] = float("nan")
    nan_wc[0], nan_cc[0] = 0x7F, 0x7F  # e4m3 NaN values (window), an e4m3 NaN scale (compressed)

    def outputs(kv_rows, window_cache, compressed_cache):
        """The bf16-rows call, then the paged call unsplit and in 3 splits."""
        return [mini_flashmla.sparse_mla_fwd(q, kv_rows, idx, SCALE, sink)] + [
            mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, SCALE, sink, splits)
            for splits in (1, 3)]

    for (out, lse), (clean_out, clean_lse) in zip(outputs(nan_kv, nan_wc, nan_cc), outputs(kv, wc, cc)):
        assert out.isfinite().all()
        assert torch.equal(out.view(torch.int16), clean_out.view(torch.int16)) and torch.equal(lse, clean_lse)


def _indexer_case(g, s_q, n_rows, device, n_heads=32):
    q = fp4_fakequant(torch.randn(s_q, n_heads, 128, generator=g), 32, "ue8m0").bfloat16().to(device)
    weights = (torch.randn(s_q, n_heads, generator=g) * 0.05).bfloat16().to(device)
    cache = pack_index_k_fp4(torch.randn(n_rows, 128, generator=g)).to(device)
    return q, weights, cache


def assert_scores_match(score, ref):
    assert torch.equal(torch.isneginf(score), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    diff = score[finite] != ref[finite]
    assert diff.float().mean().item() <= 1e-3
    if diff.any():
        ulp = ref[finite][diff].abs() * 2**-7
        assert ((score[finite][diff] - ref[finite][diff]).abs() <= ulp).all()


def assert_topk_tie_aware(idx, ref_idx, score):
    assert torch.equal(idx == -1, ref_idx == -1) or torch.equal((idx == -1).sum(1), (ref_idx == -1).sum(1))
    def picked_scores(i):
        return torch.where(i >= 0, score.gather(1, i.clamp_min(0).long()), float("-inf")).sort(1).values

    assert torch.equal(picked_scores(idx), picked_scores(ref_idx))
    assert (idx[:, 1:] >= idx[:, :-1]).logical_or(idx[:, 1:] == -1).all()  # ascending, -1 at the end


@pytest.mark.parametrize("s_q,n_keys,n_heads,per_query",
                         [(9, 700, 32, False), (5, 300, 32, True), (3, 130, 4, False), (4, 257, 24, False),
                          (6, 2100, 32, True), (4, 1000, 24, True), (3, 500, 64, False), (5, 400, 8, True)])
def test_indexer_scores_and_topk(device, s_q, n_keys, n_heads, per_query):
    g = torch.Generator().manual_seed(s_q + n_keys)
    q, w, cache = _indexer_case(g, s_q, 1000, device, n_heads)
    if per_query:  # a ragged batch: every query its own rows, -1 padded
        rows = torch.randint(0, 1000, (s_q, n_keys), generator=g, dtype=torch.int32)
        rows[1, 100:] = -1
        rows = rows.to(device)
    else:
        rows = torch.randperm(1000, generator=g)[:n_keys].to(torch.int32).to(device)
    visible = torch.randint(0, n_keys + 1, (s_q,), generator=g).to(device)
    visible[0] = 0
    visible[-1] = n_keys
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows)
    ref = reference.indexer_scores_paged_ref(q, w, cache, visible, rows)
    assert_scores_match(score, ref)
    idx = mini_flashmla.indexer_topk(q, w, cache, visible, rows, 64)
    assert_topk_tie_aware(idx, reference.indexer_topk_ref(ref, 64), ref)


def test_indexer_shared_keys_runs_of_query_tiles(device):
    """The shared-key kernel's programs score one 128-key tile against a run of query tiles (here 6 tiles of 4
    queries: 24 key tiles x 150 query tiles over ~4 programs per SM), the last run and key tile ragged, causal."""
    g = torch.Generator().manual_seed(16)
    s_q, n_keys = 598, 3000
    q, w, cache = _indexer_case(g, s_q, 3100, device)
    rows = torch.randperm(3100, generator=g)[:n_keys].to(torch.int32).to(device)
    visible = (torch.arange(s_q) * 5 + 11).clamp_max(n_keys).to(device)
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows)
    assert_scores_match(score, reference.indexer_scores_paged_ref(q, w, cache, visible, rows))


def test_indexer_weights_must_be_bf16(device):
    q, w, cache = _indexer_case(torch.Generator().manual_seed(17), 2, 100, device)
    rows, visible = torch.arange(100, dtype=torch.int32, device=device), torch.full((2,), 100, device=device)
    with pytest.raises(ValueError, match="weights must be bf16"):
        mini_flashmla.indexer_scores(q, w.float(), cache, visible, rows)


def test_indexer_per_query_runs_of_key_tiles(device):
    """The per-query kernel's programs walk runs of key tiles (more tiles than ~4 programs per SM need: a run of 9
    on 132 SMs), ragged at the end of the key list, with -1 rows and visibility cutting runs in the middle."""
    g = torch.Generator().manual_seed(14)
    s_q, n_keys = 16, 40_000
    q, w, cache = _indexer_case(g, s_q, 5000, device)
    rows = torch.randint(0, 5000, (s_q, n_keys), generator=g, dtype=torch.int32)
    rows[2, 777:] = -1
    rows[3, ::5] = -1
    visible = torch.randint(0, n_keys + 1, (s_q,), generator=g)
    visible[0], visible[1] = 0, n_keys
    score = mini_flashmla.indexer_scores(q, w, cache, visible.to(device), rows.to(device))
    assert_scores_match(score, reference.indexer_scores_paged_ref(q, w, cache, visible.to(device), rows.to(device)))


def test_indexer_per_query_beyond_one_grid_axis(device):
    """More queries than CUDA allows on a launch grid's y axis (65,535; the per-query kernel puts them on x); 4 heads,
    as the tiny model's indexer; each query its own 64 keys, -1 rows and visibility as a decode batch has them."""
    g = torch.Generator().manual_seed(15)
    s_q, n_keys = 65_535 + 70, 64
    q, w, cache = _indexer_case(g, s_q, 2000, device, n_heads=4)
    rows = torch.randint(0, 2000, (s_q, n_keys), generator=g, dtype=torch.int32)
    rows[::7, 40:] = -1
    visible = torch.randint(0, n_keys + 1, (s_q,), generator=g).to(device)
    rows = rows.to(device)
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows)
    assert_scores_match(score, reference.indexer_scores_paged_ref(q, w, cache, visible, rows))


@pytest.mark.parametrize("layout", ["contiguous", "head_major"])
def test_indexer_scores_past_2_31_elements(device, layout):
    """The shared-key kernel's q offsets past 2**31, which it forms in 32 bits: a contiguous q of 524,291 queries (a
    query's offset, query x 32 x 128: the API splits the launch) and a head-major one of 541,204 (head 31's offset,
    31 x 128 x s_q: the API copies q into the contiguous layout, then splits). Every query holds the same FP4 values
    but the probed rows at both ends, which hold their own; scores as the reference's."""
    g = torch.Generator().manual_seed(37)
    s_q = 524_291 if layout == "contiguous" else 541_204
    n_keys, probes = 64, [0, 1, s_q - 2, s_q - 1]
    base, w_base, cache = _indexer_case(g, 1, 200, device)
    probe_q, probe_w, _ = _indexer_case(g, len(probes), 200, device)
    if layout == "contiguous":
        q = base.expand(s_q, -1, -1).contiguous()
    else:
        q = base.transpose(0, 1).expand(-1, s_q, -1).contiguous().transpose(0, 1)
        assert q.stride(1) * 31 > 2**31
    w = w_base.expand(s_q, -1).contiguous()
    rows = torch.tensor(probes, device=device)
    q[rows], w[rows] = probe_q, probe_w
    key_rows = torch.randperm(200, generator=g)[:n_keys].to(torch.int32).to(device)
    visible = torch.full((s_q,), n_keys, device=device)
    score = mini_flashmla.indexer_scores(q, w, cache, visible, key_rows)
    assert_scores_match(score[rows], reference.indexer_scores_paged_ref(q[rows], w[rows], cache, visible[rows],
                                                                        key_rows))


def test_candidate_blocks_and_reindex(device):
    g = torch.Generator().manual_seed(21)
    q, w, cache = _indexer_case(g, 6, 600, device)
    rows = mini_flashmla.key_range_rows(40, 512, device)
    visible = torch.tensor([1, 64, 200, 400, 511, 512], device=device)
    ref = reference.indexer_scores_paged_ref(q, w, cache, visible, rows)
    blocks = mini_flashmla.candidate_blocks(q, w, cache, visible, rows, compress_len=512, block=8, topk_blocks=10)
    ref_mask = reference.candidate_block_mask_ref(ref, 512, 8, 10)
    # compared as the model's mask (the ids of one swapped tie would shift every id after it)
    entries = reference.candidate_entries(blocks.cpu(), 8)
    mask = torch.zeros(6, 513, dtype=torch.bool)  # the last column takes the -1 entries
    mask.scatter_(1, torch.where(entries >= 0, entries, 512), True)
    assert (mask[:, :512] != ref_mask.cpu()).float().mean().item() <= 0.02  # block ties may pick an equal block
    ref_blocks = reference.candidate_blocks_ref(ref, 512, 8, 10)
    idx = mini_flashmla.indexer_topk(q, w, cache, visible, rows, 32, candidate_blocks=ref_blocks)
    masked = ref.masked_fill(~ref_mask, float("-inf"))
    assert_topk_tie_aware(idx, reference.indexer_topk_ref(masked, 32), masked)


@pytest.mark.parametrize("per_query", [False, True])
def test_indexer_scores_of_candidate_blocks(device, per_query):
    """The per-query kernel reading keys through candidate blocks (the REINDEX path): 300 queries (several programs
    per query's run of columns), blocks ascending with -1 tails and a whole -1 row, a last block past the key list,
    causal visibility cutting blocks; shared key rows (prefill) and per-query rows (decode)."""
    g = torch.Generator().manual_seed(22)
    s_q, n_keys, kb = 300, 1001, 100
    q, w, cache = _indexer_case(g, s_q, 1200, device)
    rows = torch.randperm(1200, generator=g)[:n_keys].to(torch.int32)
    if per_query:
        rows = rows.expand(s_q, -1).clone()
        rows[5, ::3] = -1
    blocks = torch.rand(s_q, 125, generator=g).argsort(1)[:, :kb].sort(1).values.to(torch.int32)
    blocks[:, -1] = 125  # entries 1000 .. 1007: all but the first past the key list
    blocks[7, 60:] = -1
    blocks[8] = -1
    visible = torch.randint(0, n_keys + 1, (s_q,), generator=g)
    visible[:2] = n_keys
    rows, blocks, visible = rows.to(device), blocks.to(device), visible.to(device)
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows, blocks, 8)
    ref = reference.indexer_scores_candidates_ref(q, w, cache, visible, rows, blocks, 8)
    assert score.shape == (s_q, kb * 8)
    assert_scores_match(score, ref)
    idx = mini_flashmla.indexer_topk(q, w, cache, visible, rows, 64, candidate_blocks=blocks)
    full = reference.indexer_scores_paged_ref(q, w, cache, visible, rows)
    entries = reference.candidate_entries(blocks, 8)
    mask = torch.zeros(s_q, n_keys + 1, dtype=torch.bool, device=device)  # the last column takes the non-entries
    mask.scatter_(1, torch.where((entries >= 0) & (entries < n_keys), entries, n_keys), True)
    masked = full.masked_fill(~mask[:, :n_keys], float("-inf"))
    assert_topk_tie_aware(idx, reference.indexer_topk_ref(masked, 64), masked)
