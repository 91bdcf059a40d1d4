"""The selection kernel (topk_kernel.py) against reference.indexer_topk_ref / candidate_blocks_ref: bit for bit,
on data with many ties (GPU; also on CPU under TRITON_INTERPRET=1, small shapes, which CI runs through the
subprocess test at the end).

The loop steps are shrunk (api.TOPK_BLOCK, TOPK_RESIDENT_BLOCK) so small rows still take several steps per pass,
and the GPU-only case runs the prefill's row length with the default steps and no host synchronisation.
"""

import os

import pytest
import torch
from mini_deepgemm.testing import run_interpreted

from mini_flashmla import api, reference

pytestmark = pytest.mark.gpu
NEG_INF = float("-inf")


@pytest.fixture
def small_step(monkeypatch):
    monkeypatch.setattr(api, "TOPK_BLOCK", 64)
    monkeypatch.setattr(api, "TOPK_RESIDENT_BLOCK", 64)


def tied_scores(g: torch.Generator, s_q: int, n: int, kind: str) -> torch.Tensor:
    """fp32 [s_q, n] scores with ties: 'bf16' randn rounded to bf16, 'few' 4 distinct values (with -0.0 and +0.0),
    'fp32' values that differ only in their low 16 bits, with repeats; row 0 all -inf, row 1 mostly -inf,
    row 2 visible up to a causal limit, row 3 with +inf entries."""
    if kind == "bf16":
        x = torch.randn(s_q, n, generator=g).bfloat16().float()
    elif kind == "few":
        x = torch.tensor([-0.0, 0.0, 0.5, -1.25])[torch.randint(0, 4, (s_q, n), generator=g)]
    else:  # few bf16 values with random low 16 bits: keys share their top 2 bytes, so all 4 radix passes run
        high = torch.tensor([0.75, -2.5, 3.0]).view(torch.int32)[torch.randint(0, 3, (s_q, n), generator=g)]
        x = (high | torch.randint(0, 1 << 16, (s_q, n), generator=g, dtype=torch.int32)).view(torch.float32)
        x[:, ::5] = x[:, 1:2]  # repeats of a full fp32 value
    x[0] = NEG_INF
    x[1, torch.rand(n, generator=g) < 0.9] = NEG_INF
    x[2, n // 3 :] = NEG_INF
    x[3, :: max(1, n // 4)] = float("inf")
    return x


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = (got.cpu() != want.cpu()).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} entries differ, first at {bad[0].tolist()}"


ROUTES = ["append", "registers", "streaming"]


def take_route(monkeypatch, route: str) -> None:
    """append: rows held in registers (their bf16 rows' band found there, 'fp32' rows fall through to the radix
    passes), bf16 rows with few enough ties selected by appending their candidates ('few' rows have too many and
    take the selection pass); registers: the same with TOPK_APPEND_SLOTS_PER_K = 0, every row by the selection
    pass; streaming: TOPK_RESIDENT_MAX_PAIRS = 0, every row by the passes over memory."""
    if route == "registers":
        monkeypatch.setattr(api, "TOPK_APPEND_SLOTS_PER_K", 0)
    if route == "streaming":
        monkeypatch.setattr(api, "TOPK_RESIDENT_MAX_PAIRS", 0)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind", ["bf16", "few", "fp32"])
@pytest.mark.parametrize("n,k", [(300, 64), (200, 200), (40, 64), (129, 1), (1000, 100)])
def test_topk_of_scores_exact(device, small_step, monkeypatch, route, kind, n, k):
    if route == "registers" and kind == "fp32":
        pytest.skip("fp32 rows take the radix passes on the append route already")
    take_route(monkeypatch, route)
    g = torch.Generator().manual_seed(n * 7 + k)
    score = tied_scores(g, 6, n, kind)
    assert_same(api.topk_of_scores(score.to(device), k), reference.indexer_topk_ref(score, k))


@pytest.mark.parametrize("band", [4, 68, 69])
def test_appended_candidates_at_the_scratch_limit(device, small_step, band):
    """k = 64 gives 128 scratch slots: 60 values above the band and `band` tied at the k-th value, so 64 / 128
    candidates are appended (the 4 lowest-positioned ties kept), and 129 overflow to the selection pass."""
    g = torch.Generator().manual_seed(band)
    score = torch.randn(3, 700, generator=g).bfloat16().float().clamp(max=2.0)
    for row in score:
        spots = torch.randperm(700, generator=g)
        row[spots[:60]] = 5.0 + torch.arange(60) % 7
        row[spots[60 : 60 + band]] = 3.0
    score[2, :350] = NEG_INF  # no candidate left of the middle
    assert_same(api.topk_of_scores(score.to(device), 64), reference.indexer_topk_ref(score, 64))


def test_resident_needs_a_row_that_fits(device):
    score = torch.zeros(2, 64, device=device)
    out = torch.empty((2, 8), dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="forced_item=3"):
        api._launch_select(score, 64, 8, 3, out, group=1, resident=True)


@pytest.mark.parametrize("route", ["append", "streaming"])
@pytest.mark.parametrize("kind", ["bf16", "few", "fp32"])
@pytest.mark.parametrize("n,k,chunks", [(1000, 100, 2), (1000, 100, 16), (300, 64, 3), (129, 1, 4), (40, 40, 3)])
def test_chunked_topk_exact(device, small_step, monkeypatch, route, kind, n, k, chunks):
    """The chunked route's two passes (per-chunk candidates, then the selection among them), including chunks
    shorter than k (1,000 keys in 16 chunks of 63) and a k equal to the row length, with chunks held in registers
    or read by the passes (take_route; the 'few' rows' chunks take the selection pass from registers)."""
    take_route(monkeypatch, route)
    g = torch.Generator().manual_seed(n * 13 + k + chunks)
    score = tied_scores(g, 6, n, kind)
    assert_same(api._chunked_topk(score.to(device), k, chunks), reference.indexer_topk_ref(score, k))


def test_chunked_topk_on_strided_rows(device, small_step):
    """The chunked route on a view whose row stride is wider than its columns (the engine slices score chunks)."""
    g = torch.Generator().manual_seed(9)
    wide = tied_scores(g, 5, 700, "bf16")
    assert_same(api._chunked_topk(wide.to(device)[:, :650], 96, 4), reference.indexer_topk_ref(wide[:, :650], 96))


def test_few_queries_take_the_chunked_route(device, small_step, monkeypatch):
    """Rows too long to hold in registers (here: over 512 keys) are split into chunks that fit, and further when the
    queries are few; with no rows in registers, only when the queries are few."""
    monkeypatch.setattr(api, "TOPK_MIN_CHUNK_KEYS", 16)
    sms = api._num_sms(torch.device(device))
    assert api._topk_chunks(4, 1000, 100, sms) == 1  # held in registers
    monkeypatch.setattr(api, "TOPK_RESIDENT_MAX_PAIRS", 256)
    assert api._topk_chunks(1, 1000, 100, sms) > 2 and api._topk_chunks(sms, 1000, 100, sms) == 2
    monkeypatch.setattr(api, "TOPK_RESIDENT_MAX_PAIRS", 0)
    assert api._topk_chunks(4, 1000, 100, sms) > 1 and api._topk_chunks(sms, 1000, 100, sms) == 1
    monkeypatch.setattr(api, "TOPK_RESIDENT_MAX_PAIRS", 256)
    g = torch.Generator().manual_seed(8)
    score = tied_scores(g, 4, 1000, "few")
    assert_same(api.topk_of_scores(score.to(device), 100), reference.indexer_topk_ref(score, 100))


@pytest.mark.parametrize("kind", ["bf16", "few", "fp32"])
@pytest.mark.parametrize("n,compress_len,topk_blocks", [
    (300, 300, 10),  # the newest entry's block forced
    (301, 1, 10),  # n not a multiple of 8; the first block forced
    (77, 0, 4),  # nothing forced
    (60, 60, 8),  # every block kept (topk_blocks = number of blocks)
    (50, 45, 100),  # topk_blocks > number of blocks
    (1000, 999, 40),
])
def test_candidate_blocks_of_scores_exact(device, small_step, kind, n, compress_len, topk_blocks):
    g = torch.Generator().manual_seed(n * 11 + compress_len)
    score = tied_scores(g, 6, n, kind)
    got = api.candidate_blocks_of_scores(score.to(device), compress_len, 8, topk_blocks)
    assert_same(got, reference.candidate_blocks_ref(score, compress_len, 8, topk_blocks))


def test_strided_rows_and_default_step(device):
    """A view with a row stride wider than its columns (the engine slices score chunks), default loop step."""
    g = torch.Generator().manual_seed(5)
    wide = tied_scores(g, 5, 700, "bf16")
    score = wide[:, :650]
    assert_same(api.topk_of_scores(score.to(device), 96), reference.indexer_topk_ref(score, 96))
    got = api.candidate_blocks_of_scores(wide.to(device)[:, :650], 650, 8, 20)
    assert_same(got, reference.candidate_blocks_ref(score, 650, 8, 20))


def test_empty_shapes(device):
    score = torch.zeros(0, 10, device=device)
    assert api.topk_of_scores(score, 4).shape == (0, 4)
    assert api.topk_of_scores(torch.zeros(3, 0, device=device), 4).shape == (3, 0)
    assert api.candidate_blocks_of_scores(score, 10, 8, 2).shape == (0, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="prefill row length: CUDA only")
def test_prefill_shape_exact_without_sync():
    """64 queries x 65,536 keys, top-512 and top-2048 of 8,192 blocks, causal -inf tails and few distinct values,
    with CUDA's sync debug mode raising on any host synchronisation. Since session 34 the rows are held in registers
    (before, 64 queries took the chunked route)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n = 65536
    score = (torch.randn(64, n, device="cuda", generator=g) * 0.25).bfloat16().float()
    score[::2] = score[::2].round()  # few distinct values: most of the row ties
    limit = torch.randint(0, n + 1, (64, 1), device="cuda", generator=g)
    limit[0], limit[1], limit[2] = 0, 300, n
    score = score.masked_fill(torch.arange(n, device="cuda")[None, :] >= limit, NEG_INF)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        idx = api.topk_of_scores(score, 512)
        blocks = api.candidate_blocks_of_scores(score, n, 8, 2048)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same(idx, reference.indexer_topk_ref(score, 512))
    assert_same(blocks, reference.candidate_blocks_ref(score, n, 8, 2048))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="prefill row length: CUDA only")
def test_prefill_rows_held_in_registers():
    """264 queries x 65,536 keys, every row held in registers (rows that fit are never split) at the prefill's
    size (32,768 pairs, inline-PTX compares): bf16 rows with ties, -0.0 beside +0.0, +inf, causal
    -inf tails (all -inf, fewer finite values than k, exactly k), and rows that are not bf16 (the radix passes)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    n, k = 65536, 512
    score = (torch.randn(264, n, device="cuda", generator=g) * 0.25).bfloat16().float()
    score[::3] = score[::3].round()
    score[5::7] = -score[5::7].abs().round()  # -0.0 and negative ties
    score[6, ::1000] = float("inf")
    limit = torch.randint(0, n + 1, (264, 1), device="cuda", generator=g)
    limit[0], limit[1], limit[2], limit[3] = 0, 300, k, n
    score = score.masked_fill(torch.arange(n, device="cuda")[None, :] >= limit, NEG_INF)
    score[7] += 1e-3 * torch.rand(n, device="cuda", generator=g)  # not bf16: the passes over memory
    assert api._topk_chunks(264, n, k, api._num_sms(score.device)) == 1
    assert_same(api.topk_of_scores(score, k), reference.indexer_topk_ref(score, k))
    # a ratio-1 layer's 131,072 keys: two chunks of 65,536 held in registers (40 queries x 4 chunks would exceed
    # an H200's 132 SMs, so no further split), then the 1,024 candidates
    wide = torch.cat([score[:40], score[40:80].flip(1)], dim=1)
    assert api._topk_chunks(40, 2 * n, k, api._num_sms(score.device)) == 2
    assert_same(api.topk_of_scores(wide, k), reference.indexer_topk_ref(wide, k))


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="CUDA (or an interpreter run) executes this file's kernel tests directly")
def test_kernel_tests_run_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's selection tests once under TRITON_INTERPRET=1, in a subprocess (the
    interpreter is chosen when the kernels are defined)."""
    pytest.importorskip("triton")
    out = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], timeout=900, expect=" passed")
    assert " failed" not in out, out[-3000:]
