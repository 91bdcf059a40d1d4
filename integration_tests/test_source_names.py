"""Every global name a function reads is defined in its module (or is a builtin), in every Python file of the
repository, checked on the CPU from the source alone.

Why: most GPU code and GPU tests never run in CPU CI, so a name deleted by mistake there fails only on the GPU
machine, sessions later (session 40: a GPU test's helper, removed in a clean-up commit, surfaced as two NameErrors
in the next GPU run). Python's own symbol tables (`symtable`) say which names each function reads as globals;
nothing is imported or run.
"""

from __future__ import annotations

import ast
import builtins
import pathlib
import symtable

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("packages", "runtime", "integration_tests", "benchmarks")
# names a module gets without defining them: set by the interpreter, or read through a guard such as
# `if "name" in globals()`
IMPLICIT = {"__file__", "__name__", "__doc__", "__spec__", "__builtins__", "__loader__", "__package__", "__path__"}


def python_files() -> list[pathlib.Path]:
    files = []
    for d in SOURCE_DIRS:
        files += [p for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts]
    return sorted(files)


def module_names(tree: ast.Module, table: symtable.SymbolTable) -> set[str]:
    """Names bound at module level: assignments, imports, defs and classes, and `global` declarations in functions."""
    names = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    return names


def unresolved_globals(path: pathlib.Path) -> list[str]:
    """'function: name' for each global a function (at any depth) reads that the module never binds."""
    source = path.read_text()
    tree = ast.parse(source)
    if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(tree)):
        return []  # a star import binds names the source does not show
    top = symtable.symtable(source, str(path), "exec")
    known = module_names(tree, top) | set(dir(builtins)) | IMPLICIT
    missing = []
    stack = list(top.get_children())
    while stack:
        table = stack.pop()
        stack += table.get_children()
        for sym in table.get_symbols():
            if sym.is_global() and sym.is_referenced() and sym.get_name() not in known:
                missing.append(f"{table.get_name()}: {sym.get_name()}")
    return missing


def test_every_global_a_function_reads_is_defined():
    files = python_files()
    assert len(files) > 100, "the scan found too few files: is ROOT right?"
    problems = {str(p.relative_to(ROOT)): m for p in files if (m := unresolved_globals(p))}
    assert not problems, f"names read as globals but never defined in their module: {problems}"


def test_the_check_finds_a_deleted_helper(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text("import torch\n\ndef test_x():\n    return _tile_table(torch.zeros(1))\n")
    assert unresolved_globals(module) == ["test_x: _tile_table"]
    module.write_text("def _tile_table(x):\n    return x\n\ndef test_x():\n    return _tile_table(1)\n")
    assert unresolved_globals(module) == []
