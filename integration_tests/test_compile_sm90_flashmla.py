"""mini_flashmla's public APIs compiled for an H200 (sm_90) at DeepSeek-V4.1's shapes, on a machine without a GPU.

What each case checks, through `sm90_compile.compiling_for_sm90()` (the API called with `cuda_like` CPU tensors
takes its H200 route; every launch compiles for sm_90 instead of running):
1. the kernels compiled, by name and in launch order: which kernels a call launches is its route (Gluon or Triton
   attention, split or not, the indexer's shared-key or per-query kernel, the top-k's resident or chunked
   selection), so a change of route fails here rather than as a slowdown on the GPU machine. Under triton 3.6 (the
   GPU machine's) the attention takes the Gluon kernel; under another release (the uv lock's 3.9), or with
   MINI_DEEPGEMM_GLUON=0, mini_deepgemm._backend.gluon_usable() is False and the Triton kernel takes its calls, hence
   two expected lists;
2. that every kernel launches on sm_90: shared memory within 227 KiB, registers x threads within 65,536;
3. no local memory (the stack frame: register spills), or where a kernel has some today (the Triton attention
   kernel, the top-k's rows held in registers), no more than today's amount under the triton release compiling.
The GPU-only constexpr branches (FP4_ASM = q.is_cuda, ASM = not interpreting: the inline PTX of dequant_triton and
topk_kernel) are the ones compiled, since cuda_like tensors say is_cuda. dequant_triton.py has no kernel of its own:
its @triton.jit helpers compile inside the attention and indexer kernels. `pytest -s` prints each kernel's resources.

Shapes (api.py's docstring, V41Config): h = 64 heads of d = 512; 128 window slots (ring rows of 528 B) and top-512
compressed entries (rows of 288 B); the indexer's 32 heads x 128 dims over index-key rows of 68 B; at 131k context
the ratio-2 layers index 65,536 keys and the ratio-1 layers 131,072; prefill runs 4,096 queries at a time
(model.INDEXER_QUERY_SLICE), the REINDEX layers score 2,048 candidate blocks of 8 entries.

One route decision would not see an H200 through cuda_like, and is given one here: api._num_sms asks
`device.type == "cuda"`, which a CudaLike tensor does not fake (its device is the CPU), and answers 8 SMs; the
attention's decode splits and the top-k's chunks follow it. It is patched to 132 SMs. (The scores that indexer_topk
and candidate_blocks allocate and pass on are cuda_like through sm90_compile's allocation mode.)
No kernel runs and the host reads no operand's values, so operands are torch.empty, except index tensors (zeros: valid
rows, should anything gather with them), visible lengths (full) and key rows (a valid range).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not importable: nothing compiles", allow_module_level=True)
import triton  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 makes the kernels interpreted functions: nothing compiles",
                allow_module_level=True)

import mini_flashmla  # noqa: E402
from mini_deepgemm._backend import gluon_usable  # noqa: E402
from mini_flashmla import api  # noqa: E402
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, INDEX_K_ROW_BYTES, WINDOW_ROW_BYTES  # noqa: E402
from sm90_compile import H200, compiling_for_sm90  # noqa: E402

HEADS = 64
HEAD_DIM = 512
WINDOW = 128
TOPK = 512  # compressed entries per query (V41Config.index_topk)
SM_SCALE = HEAD_DIM ** -0.5
PREFILL_QUERIES = 4096  # model.INDEXER_QUERY_SLICE, and the prefill chunk of the attention
INDEX_HEADS = 32
INDEX_DIM = 128
KEYS_RATIO_2 = 65536  # compressed entries at 131k context, ratio-2 layers
KEYS_RATIO_1 = 131072  # ratio-1 layers
CANDIDATE_BLOCK = 8  # V41Config.candidate_block_size
CANDIDATE_BLOCKS = 2048  # V41Config.candidate_topk_blocks
WINDOW_RING_ROWS = 256 * WINDOW  # 256 sequence slots of a 128-row ring
COMPRESSED_ROWS = KEYS_RATIO_2  # the cache's row count is only a bound the kernels check ids against

GLUON_ATTN = "sparse_mla_fwd_gluon_kernel"
TRITON_ATTN = "sparse_mla_fwd_kernel"
COMBINE = "combine_splits_kernel"
SCORES = "indexer_scores_kernel"
SCORES_PER_QUERY = "indexer_scores_per_query_kernel"
SELECT = "topk_select_kernel"


def _ids(s_q: int, n: int) -> torch.Tensor:
    """Row ids of the attention's index lists: zeros, valid rows (the host never reads them)."""
    return torch.zeros((s_q, n), dtype=torch.int32)


# --------------------------------------------------------------------------- calls at V4.1 shapes
def attn_bf16(s_q: int) -> None:
    """sparse_mla_fwd over bf16 rows, the window's 128 and the top 512 compressed slots in one list."""
    q = torch.empty(s_q, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    kv = torch.empty(KEYS_RATIO_2, HEAD_DIM, dtype=torch.bfloat16)
    mini_flashmla.sparse_mla_fwd(q, kv, _ids(s_q, WINDOW + TOPK), SM_SCALE, torch.empty(HEADS, dtype=torch.float32))


def attn_paged(s_q: int, compressed: bool = True) -> None:
    """sparse_mla_fwd_paged over the quantized window ring (FP8 rows) and compressed cache (FP4 rows), the
    automatic split (num_splits=None) as the engine calls it; compressed False: a window-only layer (ratio 0)."""
    q = torch.empty(s_q, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    window_cache = torch.empty(WINDOW_RING_ROWS, WINDOW_ROW_BYTES, dtype=torch.uint8)
    compressed_cache = torch.empty(COMPRESSED_ROWS, COMPRESSED_KV_ROW_BYTES, dtype=torch.uint8) if compressed else None
    compressed_ids = _ids(s_q, TOPK) if compressed else None
    mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, _ids(s_q, WINDOW), compressed_ids,
                                       SM_SCALE, torch.empty(HEADS, dtype=torch.float32))


def _indexer_operands(s_q: int, n_keys: int) -> tuple[torch.Tensor, ...]:
    """(q bf16 [s_q, 32, 128], weights bf16 [s_q, 32], index-key cache uint8 [n_keys, 68], visible int64 [s_q])."""
    return (torch.empty(s_q, INDEX_HEADS, INDEX_DIM, dtype=torch.bfloat16),
            torch.empty(s_q, INDEX_HEADS, dtype=torch.bfloat16),
            torch.empty(n_keys, INDEX_K_ROW_BYTES, dtype=torch.uint8),
            torch.full((s_q,), n_keys, dtype=torch.int64))


def _shared_key_rows(n_keys: int) -> torch.Tensor:
    """One sequence's keys in contiguous rows (prefill: key_rows [n_keys] shared by every query)."""
    return api.key_range_rows(0, n_keys, "cpu")


def _per_query_key_rows(s_q: int, n_keys: int) -> torch.Tensor:
    """Decode: key_rows [batch, n_keys], one sequence per query (model.visible_entry_rows' shape)."""
    return torch.zeros((s_q, n_keys), dtype=torch.int32)


def _candidates(s_q: int) -> torch.Tensor:
    """A REINDEX layer's candidate blocks: int32 [s_q, 2048] ascending block ids."""
    return torch.zeros((s_q, CANDIDATE_BLOCKS), dtype=torch.int32)


def scores_prefill() -> None:
    q, weights, cache, visible = _indexer_operands(PREFILL_QUERIES, KEYS_RATIO_2)
    mini_flashmla.indexer_scores(q, weights, cache, visible, _shared_key_rows(KEYS_RATIO_2))


def scores_decode(batch: int, n_keys: int) -> None:
    q, weights, cache, visible = _indexer_operands(batch, n_keys)
    mini_flashmla.indexer_scores(q, weights, cache, visible, _per_query_key_rows(batch, n_keys))


def scores_ragged_prefill(reindex: bool = False) -> None:
    """A general step's batch of 64 sequences (the runtime's _indexer), each its own keys: key_rows [64, 65,536]
    with query_starts; reindex: through candidate blocks (the per-query kernel)."""
    q, weights, cache, visible = _indexer_operands(PREFILL_QUERIES, KEYS_RATIO_2)
    starts = torch.arange(0, PREFILL_QUERIES + 1, PREFILL_QUERIES // 64, dtype=torch.int64)
    blocks = _candidates(PREFILL_QUERIES) if reindex else None
    mini_flashmla.indexer_scores(q, weights, cache, visible, _per_query_key_rows(64, KEYS_RATIO_2), blocks,
                                 CANDIDATE_BLOCK, query_starts=starts)


def scores_reindex_prefill() -> None:
    q, weights, cache, visible = _indexer_operands(PREFILL_QUERIES, KEYS_RATIO_2)
    mini_flashmla.indexer_scores(q, weights, cache, visible, _shared_key_rows(KEYS_RATIO_2),
                                 _candidates(PREFILL_QUERIES), CANDIDATE_BLOCK)


def indexer_topk_prefill(reindex: bool = False) -> None:
    """indexer_topk chunks its queries so that at most 256 MiB of fp32 scores exist at once: 1,024 queries x 65,536
    keys per chunk (4 chunks), or every query at once over the 16,384 candidate entries."""
    q, weights, cache, visible = _indexer_operands(PREFILL_QUERIES, KEYS_RATIO_2)
    blocks = _candidates(PREFILL_QUERIES) if reindex else None
    mini_flashmla.indexer_topk(q, weights, cache, visible, _shared_key_rows(KEYS_RATIO_2), TOPK, blocks,
                               CANDIDATE_BLOCK)


def candidate_blocks_prefill() -> None:
    q, weights, cache, visible = _indexer_operands(PREFILL_QUERIES, KEYS_RATIO_2)
    mini_flashmla.candidate_blocks(q, weights, cache, visible, _shared_key_rows(KEYS_RATIO_2),
                                   compress_len=KEYS_RATIO_2, block=CANDIDATE_BLOCK, topk_blocks=CANDIDATE_BLOCKS)


def topk_of_scores(s_q: int, n_keys: int) -> None:
    mini_flashmla.topk_of_scores(torch.empty(s_q, n_keys, dtype=torch.float32), TOPK)


def candidate_blocks_of_scores(s_q: int) -> None:
    mini_flashmla.candidate_blocks_of_scores(torch.empty(s_q, KEYS_RATIO_2, dtype=torch.float32), KEYS_RATIO_2,
                                             CANDIDATE_BLOCK, CANDIDATE_BLOCKS)


# --------------------------------------------------------------------------- cases
# Local memory (the stack frame: spills) per thread that kernels have today, as bounds; 0 everywhere else. ptxas
# spills differently under triton 3.6 (the GPU machine's) and 3.9 (the uv lock's), so each bound is per release
# (3.9's for any release but 3.6), whichever route takes the call: the GPU machine runs the Triton route too
# (MINI_DEEPGEMM_GLUON=0, docs/reports/triton-route-on-hopper.md).
TRITON_36 = triton.__version__.startswith("3.6.")


def per_release(bound_36: int, bound_39: int) -> int:
    return bound_36 if TRITON_36 else bound_39


# The Triton attention kernel (on the GPU machine only with MINI_DEEPGEMM_GLUON=0: otherwise the Gluon kernel takes
# V4.1's 64-head calls) holds a 64 x 512 fp32 accumulator over 8 warps, 128 registers per thread, beside the block's
# K=V tile and its dequantization; at ptxas's cap of 255 registers it spills, the quantized rows more (under 3.6 the
# spills are mostly hoisted wgmma descriptors: triton-route-on-hopper.md).
TRITON_ATTN_BF16_SPILL = per_release(0, 176)
TRITON_ATTN_PAGED_SPILL = per_release(768, 320)
TRITON_ATTN_WINDOW_ONLY_SPILL = per_release(40, 368)
# split (decode): 3.9 spills 432 B at batch 8's one block per split (blocks_per_split = 1 compiles its own variant),
# 320 B at batch 64's five; 3.6 744 and 776 B (session 76)
TRITON_ATTN_SPLIT_SPILL = per_release(776, 432)
TRITON_ATTN_WINDOW_ONLY_SPLIT_SPILL = per_release(32, 328)
# The top-k's rows held in registers: 16 warps at 128 registers per thread (the SM's 65,536 for one program), 64 of
# them the row's bf16 pairs (api.TOPK_RESIDENT_MAX_PAIRS); ptxas spills part of the selection's state.
SELECT_ROW_SPILL = per_release(168, 128)  # a 65,536-key row
SELECT_CHUNK_SPILL = per_release(168, 96)  # a 65,536-key chunk of a 131,072-key row (CHUNKS=2)
SELECT_CANDIDATES_SPILL = per_release(0, 8)  # a REINDEX layer's 16,384 candidates (RESIDENT_PAIRS=8192)

Launch = tuple[str, int]  # a kernel's name and the most local memory per thread it may have (today's amount)


@dataclass(frozen=True)
class Case:
    """One API call and the kernels it launches, in order, on the Gluon route (triton 3.6) and on the Triton route
    (other releases)."""

    name: str
    call: Callable[[], None]
    gluon_launches: tuple[Launch, ...]
    triton_launches: tuple[Launch, ...]


CASES = [
    Case("sparse_mla_fwd bf16 prefill s_q 4096 topk 640", lambda: attn_bf16(PREFILL_QUERIES),
         ((GLUON_ATTN, 0),), ((TRITON_ATTN, TRITON_ATTN_BF16_SPILL),)),
    Case("paged prefill s_q 4096 window+compressed", lambda: attn_paged(PREFILL_QUERIES),
         ((GLUON_ATTN, 0),), ((TRITON_ATTN, TRITON_ATTN_PAGED_SPILL),)),
    Case("paged prefill s_q 4096 window only", lambda: attn_paged(PREFILL_QUERIES, compressed=False),
         ((GLUON_ATTN, 0),), ((TRITON_ATTN, TRITON_ATTN_WINDOW_ONLY_SPILL),)),
    # decode, one query per sequence. Either kernel splits each query's 10 blocks up to ~1 program per SM (132 // 64
    # = 2 parts at batch 64, none at 256; api._default_num_splits), so batches 8 and 64 run the split path and the
    # combine kernel
    Case("paged decode batch 8", lambda: attn_paged(8),
         ((GLUON_ATTN, 0), (COMBINE, 0)), ((TRITON_ATTN, TRITON_ATTN_SPLIT_SPILL), (COMBINE, 0))),
    Case("paged decode batch 64", lambda: attn_paged(64),
         ((GLUON_ATTN, 0), (COMBINE, 0)), ((TRITON_ATTN, TRITON_ATTN_SPLIT_SPILL), (COMBINE, 0))),
    Case("paged decode batch 64 window only", lambda: attn_paged(64, compressed=False),
         ((GLUON_ATTN, 0), (COMBINE, 0)), ((TRITON_ATTN, TRITON_ATTN_WINDOW_ONLY_SPLIT_SPILL), (COMBINE, 0))),
    Case("paged decode batch 256", lambda: attn_paged(256),
         ((GLUON_ATTN, 0),), ((TRITON_ATTN, TRITON_ATTN_PAGED_SPILL),)),
    Case("indexer_scores prefill 4096 x 65536", scores_prefill, ((SCORES, 0),), ((SCORES, 0),)),
    Case("indexer_scores decode batch 64 x 65536", lambda: scores_decode(64, KEYS_RATIO_2),
         ((SCORES_PER_QUERY, 0),), ((SCORES_PER_QUERY, 0),)),
    Case("indexer_scores decode batch 64 x 131072", lambda: scores_decode(64, KEYS_RATIO_1),
         ((SCORES_PER_QUERY, 0),), ((SCORES_PER_QUERY, 0),)),
    Case("indexer_scores REINDEX prefill 4096 x 2048 blocks", scores_reindex_prefill,
         ((SCORES_PER_QUERY, 0),), ((SCORES_PER_QUERY, 0),)),
    Case("indexer_scores ragged prefill 64 sequences x 65536", scores_ragged_prefill, ((SCORES, 0),),
         ((SCORES, 0),)),
    Case("indexer_scores ragged REINDEX prefill 64 sequences", lambda: scores_ragged_prefill(reindex=True),
         ((SCORES_PER_QUERY, 0),), ((SCORES_PER_QUERY, 0),)),
    # indexer_topk and candidate_blocks score 1,024 queries at a time (256 MiB of fp32 scores), then select
    Case("indexer_topk prefill 4096 x 65536", indexer_topk_prefill,
         ((SCORES, 0), (SELECT, SELECT_ROW_SPILL)) * 4, ((SCORES, 0), (SELECT, SELECT_ROW_SPILL)) * 4),
    Case("indexer_topk REINDEX prefill 4096 x 2048 blocks", lambda: indexer_topk_prefill(reindex=True),
         ((SCORES_PER_QUERY, 0), (SELECT, SELECT_CANDIDATES_SPILL)),
         ((SCORES_PER_QUERY, 0), (SELECT, SELECT_CANDIDATES_SPILL))),
    Case("candidate_blocks prefill 4096 x 65536", candidate_blocks_prefill,
         ((SCORES, 0), (SELECT, 0)) * 4, ((SCORES, 0), (SELECT, 0)) * 4),
    # a row of 65,536 keys is held in registers (one pass); the ratio-1 layers' 131,072 are selected in 2 chunks,
    # then among the chunks' candidates (api._chunked_topk: two launches), at prefill and decode alike
    Case("topk_of_scores prefill 4096 x 65536", lambda: topk_of_scores(PREFILL_QUERIES, KEYS_RATIO_2),
         ((SELECT, SELECT_ROW_SPILL),), ((SELECT, SELECT_ROW_SPILL),)),
    Case("topk_of_scores prefill 4096 x 131072", lambda: topk_of_scores(PREFILL_QUERIES, KEYS_RATIO_1),
         ((SELECT, SELECT_CHUNK_SPILL), (SELECT, 0)), ((SELECT, SELECT_CHUNK_SPILL), (SELECT, 0))),
    Case("topk_of_scores decode 64 x 131072", lambda: topk_of_scores(64, KEYS_RATIO_1),
         ((SELECT, SELECT_CHUNK_SPILL), (SELECT, 0)), ((SELECT, SELECT_CHUNK_SPILL), (SELECT, 0))),
    Case("candidate_blocks_of_scores prefill 4096", lambda: candidate_blocks_of_scores(PREFILL_QUERIES),
         ((SELECT, 0),), ((SELECT, 0),)),
]


@pytest.fixture
def h200_sm_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """api._num_sms answers 8 for a CPU device (CudaLike's device is the CPU); on the H200 it is 132."""
    monkeypatch.setattr(api, "_num_sms", lambda device: H200.sms)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_compiles_for_sm90(case: Case, h200_sm_count: None) -> None:
    with compiling_for_sm90() as kernels:
        case.call()
    for k in kernels:
        print(k.row(case.name))
    expected = case.gluon_launches if gluon_usable() else case.triton_launches
    assert [k.name for k in kernels] == [name for name, _ in expected], "route changed"
    assert [p for k in kernels for p in k.fits()] == []
    over = [f"{k.name}: {k.local_bytes} B > {bound} B" for k, (_, bound) in zip(kernels, expected)
            if k.local_bytes > bound]
    assert over == [], "local memory (spills) beyond today's"
