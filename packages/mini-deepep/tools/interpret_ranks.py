"""Run the NVSHMEM backend's Triton kernels on CPU: simulated ranks under the Triton interpreter.

    uv run python packages/mini-deepep/tools/interpret_ranks.py [--ranks 2] [--programs 4] [--stress ROUNDS]
        [--hidden H]

Each rank is a process; the "symmetric buffers" are CPU tensors in shared memory, and a peer's offset is the
address difference, as NVLink mappings are on the GPU. The package's CPU scenarios (or the stress driver) run with
the combine checked bit for bit against the emulated arithmetic. This is how the v4 kernels were checked before
their first GPU run (docs/reports/deepep-v4-overlap.md); it is a developer tool, not part of CI (slow: minutes).

Three things the interpreter (triton 3.9, and 3.6 on the GPU machine) does differently from the GPU are patched here,
for this process only:
- %globaltimer (inline PTX) reads 0, so a wait never times out;
- a scalar mask or `other` of a load or store is broadcast to the pointer's shape (the interpreter rejects it);
- fp32 -> bf16 rounds to nearest even, as the GPU does (the interpreter truncates).
The backend object is built without NVSHMEM: `_simulated_buffer` sets the state that NvshmemBackend.__init__
sets after its bootstrap (keep the two in step).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import traceback

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import mini_deepep.kernels.combine  # noqa: E402
import mini_deepep.kernels.dispatch  # noqa: E402
import mini_deepep.kernels.signals  # noqa: E402
from mini_deepep import nvshmem_layout, testing  # noqa: E402
from mini_deepep.buffer import Buffer  # noqa: E402
from mini_deepep.nvshmem_backend import NvshmemBackend  # noqa: E402

HIDDEN, TOPK, MAX_TOKENS = 256, 6, 256  # what the CPU scenarios need


def _zero_timer():
    return tl.full((), 0, tl.int64)


def _patch_interpreter() -> None:
    for module in (mini_deepep.kernels.signals, mini_deepep.kernels.dispatch, mini_deepep.kernels.combine):
        module.globaltimer = _zero_timer
    builder = interpreter.InterpreterBuilder
    load, store, cast = builder.create_masked_load, builder.create_masked_store, builder.cast_impl

    def full_mask(mask, ptrs):
        return interpreter.TensorHandle(np.broadcast_to(np.asarray(mask.data).astype(bool), np.shape(ptrs.data)).copy(),
                                        tl.int1)

    # The trailing cache/eviction/volatile arguments differ between Triton releases (3.6 has one more than 3.9):
    # pass them through untouched.
    def masked_load(self, ptrs, mask, other, *cache_args):
        if other is not None:
            other = interpreter.TensorHandle(np.broadcast_to(np.asarray(other.data), np.shape(ptrs.data)).copy(), other.dtype)
        return load(self, ptrs, full_mask(mask, ptrs), other, *cache_args)

    def masked_store(self, ptrs, value, mask, *cache_args):
        return store(self, ptrs, value, full_mask(mask, ptrs), *cache_args)

    def rounding_cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.asarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return interpreter.TensorHandle(bits, dst_type.scalar)
        return cast(self, src, dst_type)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder.cast_impl = rounding_cast
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)


def _simulated_buffer(rank: int, buffers: list[torch.Tensor], num_programs: int) -> Buffer:
    """A Buffer whose NVSHMEM backend works on `buffers[rank]`, with the others as its peers."""
    num_ranks = len(buffers)
    backend = NvshmemBackend.__new__(NvshmemBackend)
    backend.group, backend.rank, backend.num_ranks = None, rank, num_ranks
    backend.layout = nvshmem_layout.SymmetricLayout(buffers[rank].numel(), num_ranks)
    backend.device = torch.device("cpu")
    backend.buffer, backend._finalized = buffers[rank], True
    base = buffers[rank].data_ptr()
    backend.peer_offsets = torch.tensor([(b.data_ptr() - base) // 4 for b in buffers], dtype=torch.int64)
    backend.buf32, backend.buf64 = backend.buffer.view(torch.int32), backend.buffer.view(torch.int64)
    backend.buf16 = backend.buffer.view(torch.bfloat16)
    backend.num_sms = num_programs
    backend.dispatch_sender_share, backend.combine_sender_share = 0.25, 0.5
    backend.dispatch_tile, backend.combine_tile, backend.combine_cols = 4, 2, 64  # several column blocks at hidden 256
    backend.combine_two_pass_tiles = 1  # with few reducers: one-pass and two-pass tiles both
    backend.dispatch_warps = backend.combine_warps = 8
    backend.combine_programs_per_sm = 2
    backend.trace, backend.last_trace = False, None
    backend.timeout_ns = 1 << 62
    backend._dispatch_consumed = backend._combine_consumed = 0
    backend._dispatch_epoch = backend._combine_epoch = 0
    backend.fuse_notify, backend._last_notify_fused = True, False  # fixed-row scenarios: the notify in the data kernel
    buffer = Buffer.__new__(Buffer)
    buffer.group, buffer.rank, buffer.num_ranks, buffer.backend_name = None, rank, num_ranks, "nvshmem"
    buffer.wait_timeout_s, buffer._backend = 100.0, backend
    return buffer


def _rank_main(rank: int, buffers: list[torch.Tensor], args: argparse.Namespace, results) -> None:
    torch.set_num_threads(1)
    _patch_interpreter()
    try:
        buffer = _simulated_buffer(rank, buffers, args.programs)
        cpu = torch.device("cpu")
        scenarios = testing.stress_scenarios(len(buffers))[1:3] if args.stress else testing.cpu_scenarios(len(buffers))
        if args.hidden:
            scenarios = [dataclasses.replace(s, hidden=args.hidden) for s in scenarios]
        if args.stress:
            count = testing.run_stress(buffer, scenarios, cpu, rounds=args.stress)
        else:
            count = testing.run_all(buffer, scenarios, cpu, exact_combine=True, repeats=1)
        results.put((rank, f"ok: {count} calls checked"))
    except BaseException:
        results.put((rank, traceback.format_exc()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--programs", type=int, default=4, help="programs of each data kernel (senders + receivers)")
    ap.add_argument("--stress", type=int, default=0, help="run this many stress rounds instead of the scenarios")
    ap.add_argument("--hidden", type=int, default=0,
                    help="every scenario at this hidden size, a multiple of 128 (default: theirs, 256); a size that "
                         "is not a power of two, e.g. 640, gives the rows a non-empty second piece")
    args = ap.parse_args()
    num_bytes = Buffer.get_nvl_buffer_size_hint(MAX_TOKENS, max(HIDDEN, args.hidden), TOPK, args.ranks)
    buffers = [torch.zeros(num_bytes, dtype=torch.uint8).share_memory_() for _ in range(args.ranks)]
    context = torch_mp.get_context("spawn")  # fork would inherit torch's thread pools and can hang
    results = context.Queue()
    procs = [context.Process(target=_rank_main, args=(r, buffers, args, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    outcomes = dict(results.get() for _ in procs)
    for p in procs:
        p.join()
    for rank in sorted(outcomes):
        print(f"rank {rank}: {outcomes[rank]}")
    if any(not msg.startswith("ok") for msg in outcomes.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
