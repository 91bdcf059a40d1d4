"""The indexer's ragged batch (indexer_scores with query_starts): B sequences in one call, each scored against its own
key list, must equal scoring each sequence alone, bit for bit (its scores padded with -inf to the batch's key count).
That equality lets the runtime score a general step's sequences together without a sequence's top-k depending on
what it was batched with (promise 3: recomputation is equivalent).

Where: on the CPU route (the references); under Triton's interpreter, in a subprocess, for the kernels' indexing (the
interpreter's bf16 tl.dot gives wrong values, see test_kernels.py, but the same wrong values on both sides, so what
differs is where a program reads and writes); on CUDA for the kernels' values. With candidate blocks (the per-query
kernel, a REINDEX layer) and without (the shared-key kernel)."""

import os

import pytest
import torch
from mini_deepgemm.reference import fp4_fakequant
from mini_deepgemm.testing import run_interpreted

import mini_flashmla
from mini_flashmla.cache_layout import pack_index_k_fp4

# name: (queries, keys) per sequence. Sequences without queries or without keys, one query, a one-key list;
# "long": runs of several query tiles per program; "many": 70 sequences (a 128-wide sequence search in the kernels)
CASES = {
    "mixed": ([5, 1, 0, 13, 3, 9], [300, 40, 0, 257, 1, 129]),
    "long": ([45, 1, 35, 20], [400, 350, 0, 129]),
    "many": ([1 + i % 3 for i in range(70)], [(37 * i) % 150 for i in range(70)]),
    "one": ([37], [500]),
}
CANDIDATE_BLOCK = 8
N_ROWS = 800  # rows of the index-key cache


def ragged_case(seed: int, q_lens: list[int], n_keys: list[int], device: str) -> tuple[torch.Tensor, ...]:
    """(q bf16 [T, 32, 128] FP4 values, weights bf16 [T, 32], cache uint8 [N_ROWS, 68], visible int64 [T] (each query
    at most its sequence's keys, the last query all of them), key_rows int32 [B, max keys] -1 padded, query_starts
    int64 [B + 1]) on `device`."""
    g = torch.Generator().manual_seed(seed)
    T = sum(q_lens)
    q = fp4_fakequant(torch.randn(T, 32, 128, generator=g), 32, "ue8m0").bfloat16()
    weights = (torch.randn(T, 32, generator=g) * 0.05).bfloat16()
    cache = pack_index_k_fp4(torch.randn(N_ROWS, 128, generator=g))
    key_rows = torch.full((len(q_lens), max(n_keys)), -1, dtype=torch.int32)
    visible = []
    for b, (ql, nk) in enumerate(zip(q_lens, n_keys)):
        key_rows[b, :nk] = torch.randint(0, N_ROWS, (nk,), generator=g, dtype=torch.int32)
        v = torch.randint(0, nk + 1, (ql,), generator=g)
        v[-1:] = nk
        visible.append(v)
    query_starts = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0)
    return tuple(t.to(device) for t in (q, weights, cache, torch.cat(visible), key_rows, query_starts))


def candidate_blocks(seed: int, T: int, n_cap: int, device: str) -> torch.Tensor:
    """int32 [T, 6] ascending candidate blocks of [0, cdiv(n_cap, 8)), -1 tails on every third query."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = max(6, -(-n_cap // CANDIDATE_BLOCK))
    blocks = torch.rand(T, n_blocks, generator=g).argsort(1)[:, :6].sort(1).values.to(torch.int32)
    blocks[::3, 4:] = -1
    return blocks.to(device)


def each_sequence_alone(q, weights, cache, visible, key_rows, query_starts, n_keys, blocks=None) -> torch.Tensor:
    """The ragged call's expected scores: one indexer_scores call per sequence (shared key list), -inf padded to
    key_rows' width without candidates."""
    starts = query_starts.tolist()
    parts = []
    for b, nk in enumerate(n_keys):
        r = slice(starts[b], starts[b + 1])
        one = mini_flashmla.indexer_scores(q[r], weights[r], cache, visible[r], key_rows[b, :nk],
                                           None if blocks is None else blocks[r], CANDIDATE_BLOCK)
        if blocks is None:
            one = torch.nn.functional.pad(one, (0, key_rows.shape[1] - nk), value=float("-inf"))
        parts.append(one)
    return torch.cat(parts)


def check_ragged_equals_each_sequence(device: str) -> None:
    for seed, (name, (q_lens, n_keys)) in enumerate(CASES.items()):
        q, w, cache, visible, key_rows, starts = ragged_case(seed, q_lens, n_keys, device)
        for blocks in (None, candidate_blocks(seed, q.shape[0], key_rows.shape[1], device)):
            got = mini_flashmla.indexer_scores(q, w, cache, visible, key_rows, blocks, CANDIDATE_BLOCK,
                                               query_starts=starts)
            want = each_sequence_alone(q, w, cache, visible, key_rows, starts, n_keys, blocks)
            assert got.shape == want.shape and torch.equal(got, want), (name, blocks is not None)


def test_ragged_batch_equals_each_sequence_on_the_cpu_route():
    check_ragged_equals_each_sequence("cpu")


_INTERPRETED = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import test_indexer_ragged
test_indexer_ragged.check_ragged_equals_each_sequence("cpu")
print("ragged ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA runs the kernels themselves (the gpu test below)")
def test_ragged_batch_equals_each_sequence_under_the_interpreter():
    """Both kernels' sequence search and key lists, interpreted (a subprocess: the interpreter is chosen when the
    kernels are defined)."""
    pytest.importorskip("triton")
    run_interpreted(["-c", _INTERPRETED], timeout=900, expect="ragged ok")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ragged_batch_equals_each_sequence_on_cuda():
    check_ragged_equals_each_sequence("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ragged_batch_of_runtime_size_on_cuda():
    """A general step's size: 4,096 queries over 24 sequences of 1 to 1,000 queries, up to 20,000 keys each (runs of
    query tiles per program and ragged key tiles on 132 SMs), against each sequence alone."""
    g = torch.Generator().manual_seed(99)
    q_lens = torch.randint(1, 300, (23,), generator=g).tolist()
    q_lens.append(4096 - sum(q_lens))
    n_keys = torch.randint(0, 20_000, (24,), generator=g).tolist()
    q, w, cache, visible, key_rows, starts = ragged_case(7, q_lens, n_keys, "cuda")
    got = mini_flashmla.indexer_scores(q, w, cache, visible, key_rows, query_starts=starts)
    assert torch.equal(got, each_sequence_alone(q, w, cache, visible, key_rows, starts, n_keys))


def test_ragged_batch_operands_are_checked():
    q, w, cache, visible, key_rows, starts = ragged_case(0, [2, 3], [10, 20], "cpu")
    with pytest.raises(ValueError, match="query_starts must be \\[B \\+ 1\\]"):
        mini_flashmla.indexer_scores(q, w, cache, visible, key_rows, query_starts=starts[:-1])
    with pytest.raises(ValueError, match="query_starts must be \\[B \\+ 1\\]"):
        mini_flashmla.indexer_scores(q, w, cache, visible, key_rows[0], query_starts=starts[:2])
    with pytest.raises(ValueError, match="query_starts must be int64"):
        mini_flashmla.indexer_scores(q, w, cache, visible, key_rows, query_starts=starts.int())
