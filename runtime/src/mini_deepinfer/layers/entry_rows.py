"""The cache rows of a decode step's compressed entries, in one Triton kernel: what V41Model._indexer_decode hands the
indexer as key_rows.

Why: a decode row may see every entry its block table can hold, n_cap = width x 128 / ratio (65,536 at 131k context
and ratio 2), so the torch expression (entries // epb, a gather from the block table, a product, a remainder, a sum,
the visibility mask, a where and an int32 cast) is ~8 kernels over [B, n_cap] int64 per publisher: ~0.23 ms per
indexer layer at 64 sequences, ~1.9 ms of a 40-layer decode step on H200 (bench_decode --profile, session 41,
docs/reports/runtime-decode.md). Here one pass reads the tables and writes the int32 rows.

Numerics: integers, the same formula; equal to the torch expression (runtime/tests/test_entry_rows.py).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch expression runs instead
    triton = None

BLOCK_ENTRIES = 1024  # entries of one row per program

if triton is not None:

    @triton.jit
    def visible_entry_rows_kernel(tables_ptr, stride_table, n_k_ptr, out_ptr, n_cap, EPB: tl.constexpr,
                                  BLOCK: tl.constexpr):
        """Program (b, j): row b's entries g in [j x BLOCK, (j + 1) x BLOCK): out[b, g] = tables[b, g // EPB] x EPB
        + g % EPB where g < n_k[b], else -1."""
        b = tl.program_id(0)
        g = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        visible = g < tl.load(n_k_ptr + b)
        block = tl.load(tables_ptr + b * stride_table + g // EPB, mask=visible, other=0)
        rows = tl.where(visible, block * EPB + g % EPB, -1)
        tl.store(out_ptr + b.to(tl.int64) * n_cap + g, rows.to(tl.int32), mask=g < n_cap)


def visible_entry_rows(block_tables: torch.Tensor, n_k: torch.Tensor, entries_per_block: int, n_cap: int
                       ) -> torch.Tensor:
    """int32 [B, n_cap]: the flat cache row of compressed entry g of row b (entries_per_block entries per KV block,
    the blocks from block_tables int [B, width]) where g < n_k[b], else -1; n_cap <= width x entries_per_block.
    The kernel on CUDA, the torch expression (visible_entry_rows_torch, its reference) elsewhere."""
    if triton is None or not block_tables.is_cuda:
        return visible_entry_rows_torch(block_tables, n_k, entries_per_block, n_cap)
    return visible_entry_rows_kernel_call(block_tables, n_k, entries_per_block, n_cap)


def table_rows(block_tables: torch.Tensor, entries: torch.Tensor, entries_per_block: int,
               seq: torch.Tensor | None = None) -> torch.Tensor:
    """The flat cache rows of compressed entries int64 [B, n] of each row b's block table (entry g: block
    block_tables[b, g // entries_per_block], row g % entries_per_block in it), as torch operations: the decode
    step's rows of its selected entries (model.DecodeRows) and this module's reference. seq (int64, broadcast against
    entries): each row's table is block_tables[seq] instead (block_tables contiguous), read by flat index without a
    copy of those tables: the general forward's rows, each in its own sequence's table (model.StepRows)."""
    epb = entries_per_block
    if seq is None:
        blocks = block_tables.gather(1, entries // epb)
    else:
        blocks = block_tables.view(-1)[seq * block_tables.shape[1] + entries // epb]
    return blocks * epb + entries % epb


def visible_entry_rows_torch(block_tables: torch.Tensor, n_k: torch.Tensor, entries_per_block: int, n_cap: int
                             ) -> torch.Tensor:
    """visible_entry_rows as torch operations."""
    entries = torch.arange(n_cap, device=block_tables.device).expand(block_tables.shape[0], n_cap)
    rows = table_rows(block_tables.long(), entries, entries_per_block)
    return torch.where(entries < n_k[:, None], rows, -1).to(torch.int32)


def visible_entry_rows_kernel_call(block_tables: torch.Tensor, n_k: torch.Tensor, entries_per_block: int,
                                   n_cap: int) -> torch.Tensor:
    """visible_entry_rows by visible_entry_rows_kernel, on any device Triton runs on (CUDA, or the interpreter)."""
    tables = block_tables.contiguous()
    out = torch.empty(tables.shape[0], n_cap, dtype=torch.int32, device=tables.device)
    if tables.shape[0] and n_cap:
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        visible_entry_rows_kernel[(tables.shape[0], triton.cdiv(n_cap, BLOCK_ENTRIES))](
            tables, tables.stride(0), n_k.contiguous(), out, n_cap, EPB=entries_per_block, BLOCK=BLOCK_ENTRIES,
            enable_fp_fusion=True)
    return out
