"""benchmarks/ncu_summary.py on a committed Nsight Compute export (session 39 run 4: the contiguous MoE kernel's
256-row tiles, H200): the pipe and memory-unit columns read the metrics the reports quote, and the per-partition
summary finds the kernel's warp-specialized regions."""

from __future__ import annotations

import pathlib

import ncu_summary
import pytest

EXPORT = pathlib.Path(__file__).parents[1] / "docs/reports/data/s39-run4/ncu"


def test_the_columns_read_the_quoted_metrics():
    rows = ncu_summary.pipe_rows(ncu_summary.read_export(str(EXPORT), "moe_w13_fold128_raw.csv"))
    gemm = next(r for r in rows if r["kernel"].startswith("fp4_e4m3_contiguous_kernel"))
    # deepgemm-moe-fold-128.md, sessions 39 and 71
    assert gemm["us"] == pytest.approx(2878.4, abs=0.1)
    assert gemm["tensor %"] == pytest.approx(52.0, abs=0.05)
    assert gemm["smem %"] == pytest.approx(54.8, abs=0.05)
    assert gemm["l1 %"] == pytest.approx(68.7, abs=0.05)
    assert gemm["l2 %"] == pytest.approx(66.1, abs=0.05)


def test_the_partitions_are_found():
    kernels = ncu_summary.sass_kernels(ncu_summary.read_export(str(EXPORT), "moe_w13_fold128_sass.csv"))
    rows = next(rows for name, rows in kernels if "fp4_e4m3_contiguous_kernel" in name)
    lines = ncu_summary.partition_summary(rows).splitlines()
    # two math warpgroups, the converter and the producer warp, and the padding warps' parking spots
    assert len(lines) >= 4
    assert all("of samples" in line for line in lines)
