"""Which GPU kernels does a change alter? The SASS of every kernel the sm_90 compile tests build, on two trees.

Why: GPU time is scarce and a GPU test is owed for every GPU path a change touches. A kernel that compiles to the
same SASS, with the same launch configuration, as on a tree that passed on the GPU computes the same values at the
same speed; so the GPU tests a change owes are those of the kernels whose SASS moved, and of its host code. And a
refactor of kernel code (a helper shared, a module split) should leave the SASS unchanged: `--expect-identical`
shows that without a GPU.

How: for each side (a git revision, or `.` for the working tree) that side's packages/*/src and runtime/src go first
on PYTHONPATH, and this tree's integration_tests/test_compile_sm90_*.py run under pytest with SM90_SASS_LOG set
(integration_tests/sm90_compile.py): one record per compiled kernel per case, with its registers, local and shared
memory, instruction count and a digest of its SASS. Records pair up by (case, launch index). A case that fails on a
side because an API differs between the sides still records what it compiled before the failure; a launch found on
one side only is listed as such.

    uv run python benchmarks/sass_diff.py BASE [HEAD] [-k EXPR] [--expect-identical]
    PYTHONPATH=/tmp/triton36 uv run python benchmarks/sass_diff.py BASE    # triton 3.6: the Gluon routes
    uv run python benchmarks/sass_diff.py HEAD --head-env TRITON_DEFAULT_FP_FUSION=0   # what a compiler knob changes

HEAD defaults to the working tree. The SASS of both sides stays in the output folder (--out, default a temporary
one), one file per digest, for `diff`. Exit status: 0, or 1 with --expect-identical when any kernel differs.
Cold (no triton cache) the three test files take ~80 s per side on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SRC_FOLDERS = ["packages/mini-deepgemm/src", "packages/mini-flashmla/src", "packages/mini-deepep/src", "runtime/src"]
COMPILE_TESTS = ["integration_tests/test_compile_sm90_deepgemm.py", "integration_tests/test_compile_sm90_flashmla.py",
                 "integration_tests/test_compile_sm90_runtime.py"]


@dataclass(frozen=True)
class Change:
    """One kernel launch compared: its case and kernel name, and each side's record (None: not on that side)."""

    case: str
    name: str
    base: dict | None
    head: dict | None

    @property
    def same(self) -> bool:
        return self.base is not None and self.head is not None and self.base["sass"] == self.head["sass"] and all(
            self.base[k] == self.head[k] for k in ("num_warps", "shared_bytes"))


def side_sources(rev: str, folder: str) -> list[str]:
    """The src folders of revision `rev` (`.`: this working tree), extracted under `folder` when from git."""
    if rev == ".":
        return [os.path.join(ROOT, f) for f in SRC_FOLDERS]
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, *SRC_FOLDERS], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return [os.path.join(folder, f) for f in SRC_FOLDERS]


def compile_side(rev: str, out: str, label: str, pytest_args: list[str], extra_env: dict[str, str]) -> list[dict]:
    """Run the compile tests on one side's sources (with extra_env set); its records in launch order."""
    folder = os.path.join(out, f"{label}-src")
    os.makedirs(folder, exist_ok=True)
    sources = side_sources(rev, folder)
    log = os.path.join(out, f"{label}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, SM90_SASS_LOG=log, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(sources + [p for p in [os.environ.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *COMPILE_TESTS, *pytest_args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{label} ({rev}): pytest exit {done.returncode}: {summary}", flush=True)
    for line in done.stdout.splitlines():  # -ra (the project's addopts) lists each failure in one line
        if line.startswith(("FAILED", "ERROR")):
            print(f"  {line[:300]}")
    if not os.path.exists(log):
        sys.exit(f"sass_diff: no kernel compiled on the {label} side; pytest said:\n{done.stdout[-3000:]}"
                 f"{done.stderr[-3000:]}")
    with open(log) as f:
        records = [json.loads(line) for line in f]
    # a kernel compiled from another tree (an installed copy first on sys.path) would make the sides look alike
    roots = tuple(os.path.realpath(p) + os.sep for p in sources)
    strays = sorted({r["file"] for r in records if not os.path.realpath(r["file"]).startswith(roots)})
    if strays:
        sys.exit(f"sass_diff: on the {label} side these kernels came from outside its sources: {strays}")
    return records


def pair(base: list[dict], head: list[dict]) -> list[Change]:
    """Pair the two sides' records by (case, launch index within the case), in the head side's order."""
    def by_case(records: list[dict]) -> dict[str, list[dict]]:
        cases: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            cases[r["case"]].append(r)
        return cases

    base_cases, head_cases = by_case(base), by_case(head)
    changes = []
    for case in list(head_cases) + [c for c in base_cases if c not in head_cases]:
        b, h = base_cases.get(case, []), head_cases.get(case, [])
        for i in range(max(len(b), len(h))):
            rb, rh = (b[i] if i < len(b) else None), (h[i] if i < len(h) else None)
            if rb is not None and rh is not None and rb["name"] != rh["name"]:  # the route changed: two launches
                changes += [Change(case, rb["name"], rb, None), Change(case, rh["name"], None, rh)]
            else:
                changes.append(Change(case, (rh or rb)["name"], rb, rh))
    return changes


def report(changes: list[Change]) -> list[str]:
    """One line per kernel name (launches compared, identical, differing), then one per differing launch."""
    lines = []
    names = sorted({c.name for c in changes})
    for name in names:
        mine = [c for c in changes if c.name == name]
        same = sum(c.same for c in mine)
        lines.append(f"{name:36s} {len(mine):4d} launches  {same:4d} same SASS  {len(mine) - same:4d} differ")
    differing = [c for c in changes if not c.same]
    if differing:
        lines.append("")
        lines.append("differing launches (base -> head: instructions, registers, local B, shared B; SASS digests):")
    for c in differing:
        def show(r: dict | None) -> str:
            if r is None:
                return "(not launched)"
            return f"{r['instructions']} instr, {r['registers']} regs, {r['local_bytes']} B local, " \
                   f"{r['shared_bytes']} B shared [{r['sass']}]"
        lines.append(f"  {c.case} :: {c.name}")
        lines.append(f"      {show(c.base)}  ->  {show(c.head)}")
    same = sum(c.same for c in changes)
    lines.append("")
    lines.append(f"{same} of {len(changes)} kernel launches compile to the same SASS on both sides")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="git revision of the base side")
    parser.add_argument("head", nargs="?", default=".", help="git revision of the head side (default: working tree)")
    parser.add_argument("-k", default=None, help="pytest -k expression: compile only these cases")
    parser.add_argument("--out", default=None, help="folder for the records and SASS (default: a temporary one)")
    parser.add_argument("--expect-identical", action="store_true", help="exit 1 if any launch differs")
    parser.add_argument("--head-env", action="append", default=[], metavar="VAR=VALUE",
                        help="an environment variable set on the head side only (repeatable)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="sass_diff_")
    os.makedirs(out, exist_ok=True)
    pytest_args = ["-k", args.k] if args.k else []
    head_env = dict(item.split("=", 1) for item in args.head_env)
    base = compile_side(args.base, out, "base", pytest_args, {})
    head = compile_side(args.head, out, "head", pytest_args, head_env)
    changes = pair(base, head)
    print("\n".join(report(changes)))
    print(f"records and SASS: {out} (base.jsonl, head.jsonl; SASS in *.jsonl.sass/DIGEST.sass)")
    if args.expect_identical and not all(c.same for c in changes):
        sys.exit(1)


if __name__ == "__main__":
    main()
