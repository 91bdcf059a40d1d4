"""Kernel variants for experiments: a kernel module's source with edits applied, loaded as a temporary module, so the
package keeps one kernel and each variant is a stated difference from it (exp_flashmla_gluon_breakdown.py,
exp_flashmla_gluon_decode.py, exp_gemm_gluon_v3_variants.py, exp_weight_stream.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from types import ModuleType


def absolute_imports(package: str) -> tuple:
    """The edit that makes a package module's relative imports absolute (`from .m import x` and `from . import m`),
    so its edited copy loads on its own."""
    return (re.compile(r"^from \.(\w*) import", re.M),
            lambda m: f"from {package}{'.' + m.group(1) if m.group(1) else ''} import")


def edited_source(module: ModuleType, edits: list, name: str) -> str:
    """module's source with each (pattern, replacement) applied. A compiled regex replaces every match and must match
    at least once; a str must occur exactly once. Either way an edit that does not apply is an error naming the
    variant: the kernel's text changed (integration_tests/test_experiment_edits.py checks that on the CPU)."""
    source = open(module.__file__).read()
    for pattern, replacement in edits:
        if isinstance(pattern, re.Pattern):
            source, n = pattern.subn(replacement, source)
            assert n >= 1, (name, pattern.pattern)
        else:
            assert source.count(pattern) == 1, (name, pattern[:80])
            source = source.replace(pattern, replacement)
    return source


def edited_module(module: ModuleType, edits: list, name: str, workdir: str) -> ModuleType:
    """edited_source's text loaded from workdir as module `name`."""
    source = edited_source(module, edits, name)
    path = os.path.join(workdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    variant = importlib.util.module_from_spec(spec)
    sys.modules[name] = variant
    spec.loader.exec_module(variant)
    return variant
