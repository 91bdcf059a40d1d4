"""This folder on the import path, for the tests' shared module sm90_compile.py, and the benchmarks' folder, for the
tools tested here (sass_diff.py): pytest runs with --import-mode=importlib, which adds neither."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent / "benchmarks", HERE):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
