"""The NVSHMEM backend's Triton kernels on CPU: simulated ranks under the Triton interpreter (tools/interpret_ranks.py).

CPU CI has no GPU, so without this the data kernels' protocol (notify, chunk flags, tile dealing, the two combine
passes, the fills of unused entries) would only be checked on the GPU machine. Here the package's CPU scenarios run
through the kernels themselves, dispatch compared exactly with the loop reference and combine bit for bit with the
emulated arithmetic, at hidden 640: not a power of two, so every row also has a non-empty second piece
(dispatch.load_rows). About two minutes on two cores.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "interpret_ranks.py"


def _interpreter_takes_runtime_loop_bounds() -> bool:
    """triton 3.6's interpreter passes scalar arguments as 1-element arrays, and a loop bound computed from one
    (dispatch_kernel's `range(pid, num_chunks * (NUM_RANKS - 1), ...)`) fails in int() under numpy 2 ("only
    0-dimensional arrays can be converted"; the GPU machine, session 12 run 3). triton 3.9 (uv-locked) squeezes the
    array first; the releases in between were not checked."""
    import triton

    return tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 9)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter)")
@pytest.mark.skipif(importlib.util.find_spec("triton") is not None and not _interpreter_takes_runtime_loop_bounds(),
                    reason="triton < 3.9's interpreter cannot take a loop bound computed from a scalar argument")
def test_nvshmem_kernels_under_the_interpreter_two_ranks() -> None:
    # the child imports what this process imports (pytest's own path entries included, not only $PYTHONPATH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(TOOL), "--ranks", "2", "--hidden", "640"], capture_output=True,
                          text=True, timeout=1200, check=False, env=env)
    assert done.returncode == 0, f"interpret_ranks.py failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.count(": ok:") == 2, done.stdout
