"""Each kernel package works as installed alone (issue 4's "imports alone in a fresh venv, CPU references work"), two
ways:
- in a fresh interpreter where the other workspace packages and the optional GPU stacks (triton, tilelang, nvshmem)
  cannot be imported, the package imports and its CPU path computes: nothing outside its declared dependencies
  (pyproject.toml) is reached;
- its wheel, built from its own folder (`uv build`, offline: the build backend is in uv's cache once the workspace
  is synced), installed into a fresh venv with only its declared workspace dependency (mini-flashmla: mini-deepgemm),
  does the same there. The venv gets torch and numpy from this environment (a .pth line: downloading them is not
  possible offline); the other workspace packages stay out of it (their editable installs are .pth files of this
  environment's site directory, which a plain path entry does not process; checked).
torch and numpy are imported before the block: they are declared, and torch probes for triton on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest
import torch

# Every import finder is wrapped so that it does not see the blocked packages: they import as if not installed
# (ModuleNotFoundError) and importlib.util.find_spec says None, which is how the packages probe for triton.
BLOCK = """
import sys

import numpy  # noqa: F401
import torch

BLOCKED = {blocked!r}


class Without:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Without(f) for f in sys.meta_path]
for name in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:  # torch may have imported one already
    del sys.modules[name]
import importlib.util

assert all(importlib.util.find_spec(name) is None for name in BLOCKED)
"""
AFTER = """
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
"""

GPU_STACKS = ("triton", "tilelang", "nvshmem")

ROOT = Path(__file__).resolve().parents[1]
# the package, what it may not import (besides the GPU stacks), and a CPU computation checked against plain torch
CASES = {
    "mini_deepgemm": (("mini_flashmla", "mini_deepep", "mini_deepinfer"), """
import mini_deepgemm as dg

g = torch.Generator().manual_seed(0)
a, b = torch.randn(48, 256, generator=g), torch.randn(160, 256, generator=g)
d = torch.empty(48, 160, dtype=torch.bfloat16)
a_q, b_q = dg.per_token_group_quant_fp8(a, 32, "ue8m0"), dg.weight_quant_fp8(b, 32, "ue8m0")
dg.fp8_gemm_nt(a_q, b_q, d, recipe=dg.V41_RECIPE)
diff = dg.calc_diff(d.float(), a @ b.T)
assert diff < 1e-3, diff
"""),
    "mini_flashmla": (("mini_deepep", "mini_deepinfer"), """
import mini_flashmla

g = torch.Generator().manual_seed(0)
q = torch.randn(3, 64, 512, generator=g).bfloat16()
kv = torch.randn(40, 512, generator=g).bfloat16()
idx = torch.randint(0, 40, (3, 16), generator=g, dtype=torch.int32)
idx[1, 5:] = -1
out, lse = mini_flashmla.sparse_mla_fwd(q, kv, idx, 512 ** -0.5)
valid = idx >= 0
scores = torch.einsum("shd,skd->shk", q.float(), kv.float()[idx.clamp_min(0).long()]) * 512 ** -0.5
scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
want = torch.einsum("shk,skd->shd", scores.softmax(-1), kv.float()[idx.clamp_min(0).long()])
err = ((out.float() - want).norm() / want.norm()).item()
assert err < 1e-2 and torch.allclose(lse, scores.logsumexp(-1), atol=1e-3), err
"""),
    "mini_deepep": (("mini_deepgemm", "mini_flashmla", "mini_deepinfer"), """
import mini_deepep

topk = torch.tensor([[0, 5], [7, -1], [2, 3]])
layout = mini_deepep.get_dispatch_layout(topk, num_experts=8, num_ranks=2)
assert layout.num_tokens_per_rank.tolist() == [2, 2], layout
assert layout.num_tokens_per_expert.tolist() == [1, 0, 1, 1, 0, 1, 0, 1], layout
"""),
}


@pytest.mark.parametrize("package", sorted(CASES))
def test_the_package_imports_and_computes_without_the_others(package: str) -> None:
    others, check = CASES[package]
    script = BLOCK.format(blocked=(*others, *GPU_STACKS)) + textwrap.dedent(check) + AFTER
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


# import name -> the workspace packages (folders) whose wheels its venv gets: itself and its declared workspace
# dependency
WHEELS = {"mini_deepgemm": ("mini-deepgemm",), "mini_flashmla": ("mini-deepgemm", "mini-flashmla"),
          "mini_deepep": ("mini-deepep",)}


def _uv(*args: str) -> str:
    """uv's output; its stderr in the failure when it fails."""
    result = subprocess.run(["uv", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"uv {' '.join(args)}: {result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three kernel packages' wheels, each built from its own folder."""
    if shutil.which("uv") is None:
        pytest.fail("uv is not on PATH (the README's commands run through it)")
    out = tmp_path_factory.mktemp("wheels")
    for folder in ("mini-deepgemm", "mini-flashmla", "mini-deepep"):
        _uv("build", "--offline", "--wheel", "-q", "-o", str(out), str(ROOT / "packages" / folder))
    return out


@pytest.mark.parametrize("package", sorted(CASES))
def test_the_package_installs_from_its_wheel_into_a_fresh_venv_and_computes(package: str, wheels: Path,
                                                                             tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _uv("venv", "-q", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    installs = [str(next(wheels.glob(f"{name.replace('-', '_')}-*.whl"))) for name in WHEELS[package]]
    _uv("pip", "install", "-q", "--offline", "--no-deps", "--python", str(python), *installs)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    outside = {str(Path(m.__file__).resolve().parents[1]) for m in (torch, numpy)}
    Path(site, "declared_dependencies.pth").write_text("\n".join(sorted(outside)) + "\n")
    others, check = CASES[package]
    script = BLOCK.format(blocked=GPU_STACKS) + textwrap.dedent(f"""
        import importlib.util
        import {package}
        assert {package}.__file__.startswith({site!r}), {package}.__file__
        present = [name for name in {others!r} if importlib.util.find_spec(name) is not None]
        assert not present, present  # the other workspace packages are not installed here
        """) + textwrap.dedent(check) + AFTER
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert result.returncode == 0, result.stderr[-3000:]
