"""The benchmark scripts' folder on the import path, so their smoke tests import them as the scripts import each
other (bench_decode.py imports bench_prefill.py, which imports prefill_stages.py); and this folder, for the tests'
shared module kernel_devices.py (pytest runs with --import-mode=importlib, which adds neither)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parents[1] / "benchmarks"
for folder in (BENCHMARKS, HERE):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
