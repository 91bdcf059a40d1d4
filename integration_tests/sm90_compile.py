"""Compiles the repository's GPU kernels for an H200 (sm_90) on a machine without a GPU, through the real APIs.

Why: CPU CI runs the references and, under Triton's interpreter, the Triton kernels' arithmetic; it never compiles a
kernel. What only compilation finds reached the GPU machine instead: a Gluon API renamed between releases, a
constexpr branch that only CUDA tensors take (inline PTX, libdevice), shared memory over the SM's 227 KiB, a
register count that caps the programs per SM. Inside `compiling_for_sm90()` a public API called with `cuda_like`
CPU tensors takes the route it takes on an H200, and every kernel launch compiles for sm_90 instead of running
(Triton's warm-up path; the outputs stay unwritten). Each compiled kernel comes back with the resources ptxas gave it.

What is assumed of the H200: compute capability 9.0, 132 SMs. Under triton 3.6 (the GPU machine's) the Gluon
kernels take their calls as they do there; under another release (the uv lock's) mini_deepgemm routes to the
Triton kernels (mini_deepgemm._backend.gluon_usable), so that is what compiles.

`compiling_for(B200)` does the same for a B200 (compute capability 10.0, sm_100a, 148 SMs), the seeds' target,
which no GPU here has. There the Gluon kernels (Hopper's wgmma) are never routed
(mini_deepgemm._backend.gluon_runs_on), so what compiles is the Triton route. A kernel that would not launch there
shows on the CPU (session 51: the bf16-rows attention at 2 stages took 262,944 B of shared memory on sm_100a). A
compile is all it shows: nothing here says how fast a kernel runs there (test_compile_sm100.py).

Run the three files (test_compile_sm90_*.py) under the uv lock's triton, and under the GPU machine's:

    uv run pytest -s integration_tests/test_compile_sm90_*.py          # -s prints each kernel's resources
    pip install --no-deps --target /tmp/triton36 triton==3.6.0
    PYTHONPATH=/tmp/triton36 uv run pytest -s integration_tests/test_compile_sm90_*.py

Use:

    from sm90_compile import compiling_for_sm90, cuda_like
    with compiling_for_sm90() as kernels:
        api(cuda_like(torch.empty(...)), ...)
    # kernels: list[CompiledKernel], in launch order

With SM90_SASS_LOG=FILE in the environment every compiled kernel also appends a JSON line to FILE (the pytest case,
the kernel's resources, its SASS instruction count and digest, the file defining it) and its SASS to
FILE.sass/DIGEST.sass: benchmarks/sass_diff.py compares two trees that way, kernel by kernel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

SM90_SHARED_BYTES = 232448  # the most dynamic shared memory one program may ask for on sm_90 and sm_100 (227 KiB)
SM90_REGISTERS = 65536  # per SM, so per program at most (sm_90 and sm_100)
SASS_LOG_ENV = "SM90_SASS_LOG"


@dataclass(frozen=True)
class Device:
    """What a compile-only run assumes of a GPU: its compute capability (the compile target) and SM count."""

    name: str
    capability: tuple[int, int]
    sms: int


H200 = Device("H200", (9, 0), 132)
B200 = Device("B200", (10, 0), 148)


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (is_cuda), so that the APIs take their GPU routes; its data is never
    touched, because no kernel runs."""

    @property
    def is_cuda(self) -> bool:
        return True


def cuda_like(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(CudaLike)


class _AllocationsCudaLike(TorchFunctionMode):
    """Within: every plain tensor a torch function returns is cuda_like, as every tensor is on CUDA on the GPU. The
    buffers an API allocates itself (torch.empty on its operands' device) then take the GPU routes too: without this,
    mini_deepgemm's activation pass output compiled the swap-AB kernel's interpreter variant (FP4_ASM False), and
    mini_flashmla's indexer_topk ran its selection on the CPU reference (the scores it allocates were not is_cuda).
    int32 / int64 torch.empty buffers come back zeroed: they hold kernel outputs (positions, rows) that host code may
    gather with, and no kernel writes them here; other buffers (scores up to 1 GiB, packed weights) stay untouched,
    so they cost no memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.empty, torch.empty_like, torch.empty_strided) and out.dtype in (torch.int32, torch.int64):
            out.zero_()
        return tree_map(lambda t: cuda_like(t) if type(t) is torch.Tensor else t, out)


@dataclass(frozen=True)
class CompiledKernel:
    """One kernel compiled (for sm_90, or another Device's target): its name, warps per program (the warp-specialized
    partitions' included), dynamic shared memory, and from the cubin the registers per thread and local memory per
    thread (its stack frame: spills and local arrays)."""

    name: str
    num_warps: int
    shared_bytes: int
    registers: int
    local_bytes: int
    constexprs: str
    cubin: bytes = field(repr=False, compare=False)

    def fits(self) -> list[str]:
        """What keeps this kernel from launching on an H200 or a B200 (the same limits per program), if anything (an
        empty list: it launches)."""
        problems = []
        if self.shared_bytes > SM90_SHARED_BYTES:
            problems.append(f"{self.name}: {self.shared_bytes} B of shared memory > {SM90_SHARED_BYTES}")
        if self.registers * 32 * self.num_warps > SM90_REGISTERS:
            problems.append(f"{self.name}: {self.registers} registers x {32 * self.num_warps} threads > "
                            f"{SM90_REGISTERS}")
        return problems

    def sass(self) -> list[str]:
        """The kernel's SASS instructions in order, one string each, without addresses and encodings."""
        return sass_instructions(self.cubin)

    def row(self, case: str) -> str:
        """One line of a resource table: case, kernel, warps, registers, local bytes, shared bytes, constexprs."""
        return (f"{case:44s} {self.name:34s} {self.num_warps:3d} warps {self.registers:3d} regs "
                f"{self.local_bytes:4d} B local {self.shared_bytes:7d} B shared  {self.constexprs}")


class _NoStream:
    """A CUDA stream's stand-in for compile_only: ordering between streams is a no-op."""

    def wait_stream(self, _other: _NoStream) -> None:
        pass


class _CompileOnlyDriver:
    """Triton's driver.active on a machine without a GPU: a target (sm_90 or sm_100), stream 0, and a device index of
    its own per target (its arch: 90, 100). A jitted function keeps one cache per device index, made with the target
    of its first compile: with one index for both, a B200 compile followed by an H200 one in the same process got the
    B200's kernels back (session 51, test_compile_sm100.py before test_compile_sm90_*.py in CI)."""

    def __init__(self, target) -> None:
        self._target = target

    def get_current_target(self):
        return self._target

    def get_current_device(self) -> int:
        return self._target.arch

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _run_on_cubin(tool: str, args: list[str], cubin: bytes) -> str:
    """The output of one of the CUDA binary tools that ship in triton's wheel, run on a cubin."""
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([path, *args, f.name], check=True, capture_output=True, text=True).stdout


def sass_instructions(cubin: bytes) -> list[str]:
    """The SASS instructions of a cubin (nvdisasm), one string each, without addresses and encodings."""
    text = _run_on_cubin("nvdisasm", ["-c"], cubin)
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip().rstrip(";").strip()
            for line in text.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]


def _resources(cubin: bytes, name: str) -> tuple[int, int]:
    """(registers, local memory bytes) per thread of kernel `name` in a cubin, from cuobjdump. Local memory is the
    stack frame, where ptxas puts spills and local arrays (STACK), plus module-scope .local (LOCAL, which Triton does
    not emit)."""
    text = _run_on_cubin("cuobjdump", ["--dump-resource-usage"], cubin)
    usage = text.split(f"Function {name}:", 1)[1]
    registers, stack, local = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK", "LOCAL"))
    return registers, stack + local


def compiling_for_sm90() -> AbstractContextManager[list[CompiledKernel]]:
    """compiling_for(H200)."""
    return compiling_for(H200)


@contextmanager
def compiling_for(device: Device) -> Iterator[list[CompiledKernel]]:
    """Within: kernel launches compile for the device's target and are recorded (in launch order) instead of
    running; every tensor a torch function returns is cuda_like (_AllocationsCudaLike); torch.cuda reports the
    device's capability and SM count, and its streams are no-ops (_NoStream). Everything is restored on exit.
    Routes decided by a tensor's device.type (still "cpu") are not covered: the tests patch those few by name."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compiling_for: TRITON_INTERPRET=1 makes the kernels interpreted functions")
    from mini_deepgemm import _backend, gemm
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    kernels: list[CompiledKernel] = []
    run = JITFunction.run

    def warm_up(self, *args, grid, warmup, **kwargs):
        compiled = run(self, *args, grid=grid, warmup=True, **kwargs)
        name = compiled.metadata.name
        registers, local_bytes = _resources(compiled.asm["cubin"], name)
        constexprs = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k[:1].isupper())
        kernel = CompiledKernel(name, compiled.metadata.num_warps, compiled.metadata.shared, registers, local_bytes,
                                constexprs, compiled.asm["cubin"])
        kernels.append(kernel)
        if os.environ.get(SASS_LOG_ENV):
            _log_sass(os.environ[SASS_LOG_ENV], kernel, self.fn.__code__.co_filename)
        return compiled

    saved = {name: getattr(torch.cuda, name) for name in ("get_device_capability", "get_device_properties", "Stream",
                                                          "current_stream", "stream")}
    active = driver._active  # None until a first use; reset_active() would look for a GPU driver
    major, minor = device.capability
    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", 10 * major + minor, 32)))
    JITFunction.run = warm_up
    torch.cuda.get_device_capability = lambda _device=None: device.capability
    torch.cuda.get_device_properties = lambda _device=None: types.SimpleNamespace(multi_processor_count=device.sms)
    # streams (the masked split's side stream): launches here only compile, so their order is moot
    torch.cuda.Stream = torch.cuda.current_stream = lambda _device=None: _NoStream()
    torch.cuda.stream = lambda _stream: nullcontext()
    _backend.sm_count.cache_clear()
    try:
        with _AllocationsCudaLike():
            yield kernels
    finally:
        JITFunction.run = run
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        driver._active = active
        _backend.sm_count.cache_clear()
        gemm._side_stream.cache_clear()  # it may hold a _NoStream


def _log_sass(path: str, kernel: CompiledKernel, source_file: str) -> None:
    """Append the kernel's record to the JSON-lines file `path` and its SASS to path.sass/DIGEST.sass (module
    docstring). The case is pytest's current test id (empty outside pytest); source_file, the file that defines the
    kernel, shows which tree it came from."""
    text = "\n".join(kernel.sass()) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    os.makedirs(path + ".sass", exist_ok=True)
    with open(os.path.join(path + ".sass", digest + ".sass"), "w") as f:
        f.write(text)
    record = {"case": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], "name": kernel.name,
              "num_warps": kernel.num_warps, "registers": kernel.registers, "local_bytes": kernel.local_bytes,
              "shared_bytes": kernel.shared_bytes, "instructions": text.count("\n"), "sass": digest,
              "file": source_file}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
