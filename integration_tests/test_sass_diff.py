"""benchmarks/sass_diff.py and the SASS log of sm90_compile.py: launches pair up by case and launch index, a changed
route shows as two launches, and a compiled kernel's record names the SASS file it wrote."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from sass_diff import Change, pair, report


def record(case: str, name: str, sass: str, **kw) -> dict:
    return {"case": case, "name": name, "num_warps": 4, "registers": 40, "local_bytes": 0, "shared_bytes": 0,
            "instructions": 100, "sass": sass, **kw}


def test_pair_matches_launches_by_case_and_index() -> None:
    base = [record("a", "k1", "x"), record("a", "k2", "y"), record("b", "k1", "x"), record("gone", "k3", "z")]
    head = [record("a", "k1", "x"), record("a", "k2", "Y"), record("b", "k1", "x", shared_bytes=1024),
            record("new", "k1", "x")]
    changes = pair(base, head)
    assert [(c.case, c.name, c.same) for c in changes] == [
        ("a", "k1", True), ("a", "k2", False), ("b", "k1", False), ("new", "k1", False), ("gone", "k3", False)]
    assert changes[3].base is None and changes[4].head is None
    lines = report(changes)
    assert lines[-1] == "1 of 5 kernel launches compile to the same SASS on both sides"
    assert any(line.strip().startswith("(not launched)  ->  100 instr, 40 regs") for line in lines)
    assert any(line.strip().endswith("->  (not launched)") for line in lines)


def test_a_changed_route_is_two_launches() -> None:
    changes = pair([record("a", "triton_gemm", "x")], [record("a", "gluon_gemm", "y")])
    assert changes == [Change("a", "triton_gemm", changes[0].base, None), Change("a", "gluon_gemm", None,
                                                                                   changes[1].head)]
    assert not any(c.same for c in changes)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter compiles nothing")
def test_compiled_kernel_is_logged_with_its_sass(tmp_path, monkeypatch) -> None:
    pytest.importorskip("triton")
    import mini_deepgemm as dg
    from sm90_compile import SASS_LOG_ENV, compiling_for_sm90

    log = tmp_path / "kernels.jsonl"
    monkeypatch.setenv(SASS_LOG_ENV, str(log))
    with compiling_for_sm90() as kernels:
        x = torch.empty(4, 512, dtype=torch.bfloat16)
        dg.per_token_group_quant_fp8(x, 32, "ue8m0")
    (line,) = log.read_text().splitlines()
    logged = json.loads(line)
    assert logged["name"] == kernels[0].name == "act_quant_fp8_kernel"
    assert logged["case"].endswith("test_compiled_kernel_is_logged_with_its_sass")
    text = (tmp_path / "kernels.jsonl.sass" / f"{logged['sass']}.sass").read_text()
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == logged["sass"]
    assert text.splitlines() == kernels[0].sass() and logged["instructions"] == len(kernels[0].sass()) > 50


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter compiles nothing")
def test_one_revision_against_itself_is_identical(tmp_path) -> None:
    """End to end on one case: both sides are `git archive`s of HEAD, each kernel is checked to come from its own
    side's sources (sass_diff exits otherwise), and the two compile to the same SASS."""
    pytest.importorskip("triton")
    root = pathlib.Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "sass_diff.py"), "HEAD", "HEAD", "-k",
                           "fakequant_fp8_window_kv", "--out", str(tmp_path), "--expect-identical"],
                          capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 kernel launches compile to the same SASS on both sides" in done.stdout
    (record,) = [json.loads(line) for line in (tmp_path / "head.jsonl").read_text().splitlines()]
    assert record["file"].startswith(str(tmp_path / "head-src"))
