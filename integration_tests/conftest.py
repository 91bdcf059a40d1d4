"""This folder on the import path, for the tests' shared module sm90_compile.py (pytest runs with
--import-mode=importlib, which does not add it)."""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
