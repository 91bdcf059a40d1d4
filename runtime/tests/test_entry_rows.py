"""layers/entry_rows.py: the decode indexer's key rows in one kernel, against the torch expression (its reference) and
against V41Cache.entry_rows row by row. Integers: every output equal. The kernel runs on CUDA (marked gpu) and, in
CPU CI, under the Triton interpreter in a child process (TRITON_INTERPRET must be set before triton is imported)."""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers import entry_rows as er
from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE, V41Cache

from kernel_devices import INTERPRET, run_under_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (rows, table width, ratio): a decode batch of one, several rows of ratio 1 and 2, a table of one block, 131k context
CASES = [(1, 3, 2), (5, 7, 1), (9, 1, 2), (4, 40, 2)] + ([(64, 1025, 2)] if DEVICE == "cuda" else [])


def _inputs(rows: int, width: int, ratio: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Random block tables (distinct blocks, padded with block 0 past each row's own), entry counts from 0 to the
    table's capacity."""
    g = torch.Generator().manual_seed(seed)
    epb = BLOCK_SIZE // ratio
    n_cap = width * epb
    tables = torch.randperm(8 * rows * width + 1, generator=g)[1: rows * width + 1].view(rows, width)
    n_k = torch.randint(0, n_cap + 1, (rows,), generator=g)
    n_k[0] = n_cap  # a full table
    if rows > 1:
        n_k[1] = 0  # nothing visible yet
    for b in range(rows):
        tables[b, -(-int(n_k[b]) // epb):] = 0  # the sentinel block past a row's own
    return tables, n_k, epb, n_cap


def test_torch_expression_matches_the_cache_rows() -> None:
    for rows, width, ratio in CASES:
        tables, n_k, epb, n_cap = _inputs(rows, width, ratio, seed=rows + width)
        got = er.visible_entry_rows_torch(tables, n_k, epb, n_cap)
        assert got.dtype == torch.int32 and got.shape == (rows, n_cap)
        for b in range(rows):
            n = int(n_k[b])
            want = V41Cache.entry_rows(tables[b], torch.arange(n), ratio)
            assert torch.equal(got[b, :n].long(), want) and bool((got[b, n:] == -1).all())


@pytest.mark.skipif(er.triton is None, reason="needs triton")
@pytest.mark.skipif(DEVICE == "cpu" and not INTERPRET, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("rows,width,ratio", [pytest.param(*case, marks=[pytest.mark.gpu] if DEVICE == "cuda" else [])
                                              for case in CASES])
def test_kernel_equals_the_torch_expression(rows, width, ratio) -> None:
    tables, n_k, epb, n_cap = _inputs(rows, width, ratio, seed=3 * rows + width)
    want = er.visible_entry_rows_torch(tables, n_k, epb, n_cap)
    got = er.visible_entry_rows_kernel_call(tables.to(DEVICE), n_k.to(DEVICE), epb, n_cap)
    assert got.dtype == torch.int32 and torch.equal(got.cpu(), want)
    if DEVICE == "cuda":  # the dispatcher takes the kernel there
        assert torch.equal(er.visible_entry_rows(tables.cuda(), n_k.cuda(), epb, n_cap).cpu(), want)


@pytest.mark.skipif(er.triton is None or DEVICE == "cuda" or INTERPRET, reason="CUDA runs the kernel directly")
def test_kernel_runs_under_the_triton_interpreter_on_cpu() -> None:
    run_under_interpreter(__file__, "-k", "kernel_equals", timeout=300)
