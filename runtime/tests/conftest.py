"""The benchmark scripts' folder on the import path, so their smoke tests import them as the scripts import each
other (bench_decode.py imports bench_prefill.py, which imports prefill_stages.py)."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
