"""The general forward's cost per sequence of a step, and a same-input A/B of two trees (session 80, CPU).

  python3 benchmarks/exp_general_step.py count
      Torch ops one general step of the tiny model issues (CPU, its reference ops), with 256 tokens split over 1, 4,
      16 and 64 fresh sequences; the ops added per extra sequence, by the model function that issued them. On CUDA
      most of these ops are kernel launches (the CPU path runs references where CUDA runs one kernel, so the
      counts are an upper bound of the launches, not a measurement of them).
  PYTHONPATH=<tree's src folders> python3 benchmarks/exp_general_step.py launches
      The same steps on the CUDA route, on a CPU (session 81): inside integration_tests/sm90_compile.py's
      compiling_for_sm90() the APIs take their H200 routes and every Triton launch compiles instead of running (no
      value is read on the host, so the forward runs through on zeroed buffers). Counted per step: Triton launches and
      the torch ops a CUDA run would launch as kernels (views, allocations and the harness's own zeroing left out);
      no GPU measures their time.
  PYTHONPATH=<tree's src folders> python3 benchmarks/exp_general_step.py save OUT.pt
      Five general steps on the tiny model (several sequences each: fresh and continuing prefill chunks at odd
      contexts, decode rows on the general path, a bounded-replay step); the logits and every cache tensor.
  python3 benchmarks/exp_general_step.py compare A.pt B.pt
      Bit-for-bit comparison of two saves; cache rows of slot 0 (the sentinel) are listed apart.
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mini_deepinfer.models.deepseek_v41 import load_model
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.worker.forward_batch import ForwardBatch

MODEL = "tiny-random/deepseek-v4.1-flash-1017"


class OpsByFunction(TorchDispatchMode):
    """Counts dispatched ops by the innermost two model.py functions on the stack."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame, names = sys._getframe(1), []
        while frame is not None:
            if frame.f_code.co_filename.endswith("deepseek_v41/model.py"):
                names.append(frame.f_code.co_name)
            frame = frame.f_back
        self.counts["/".join(reversed(names[:2]))] += 1
        return func(*args, **(kwargs or {}))


def count() -> None:
    model = load_model(MODEL, "cpu")
    cfg, total, by_b = model.config, 256, {}
    for B in (1, 4, 16, 64):
        q = total // B
        ids = torch.randint(3, cfg.vocab_size, (total,), generator=torch.Generator().manual_seed(0))
        nblk = -(-q // 128)
        tables = [[1 + nblk * i + j for j in range(nblk)] for i in range(B)]
        batch = ForwardBatch(ids, [q] * B, [0] * B, tables, list(range(1, B + 1)), [q * (i + 1) - 1 for i in range(B)])
        mode = OpsByFunction()
        with mode:
            model(batch, V41Cache(cfg, B * nblk + 1, B + 1, "cpu"))
        by_b[B] = mode.counts
        print(f"{B:3d} sequences of {q:3d} tokens: {sum(mode.counts.values()):7,d} ops")
    per_seq = {k: (by_b[64][k] - by_b[16][k]) / 48 for k in set(by_b[64]) | set(by_b[16])}
    print("ops per extra sequence (64 against 16 sequences), by function:")
    for k, v in sorted(per_seq.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"  {v:7.1f}  {k}")


class KernelOps(TorchDispatchMode):
    """Counts the torch ops that launch a kernel on CUDA: not views, allocations, or sm90_compile's zeroing of the
    int buffers it hands out."""

    NO_KERNEL = {"empty", "empty_strided", "_local_scalar_dense", "lift_fresh"}

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        harness = name == "zero_" and sys._getframe(1).f_code.co_filename.endswith("sm90_compile.py")
        self.ops += not (func.is_view or name in self.NO_KERNEL or harness)
        return func(*args, **(kwargs or {}))


def launches() -> None:
    sys.path.insert(0, "integration_tests")
    import sm90_compile
    from mini_deepinfer.models.deepseek_v41 import ops

    sm90_compile._resources = lambda cubin, name: (0, 0)  # registers and spills are not asked here (a cuobjdump each)
    model = load_model(MODEL, "cpu")
    cfg, total = model.config, 256
    like = sm90_compile.cuda_like
    with sm90_compile.compiling_for_sm90() as kernels:
        model.w = ops.KernelWeights({k: like(v) for k, v in model.w.items()})
        model.freqs = [like(f) for f in model.freqs]
        model.token_map, model.engram_mult = like(model.token_map), [like(m) for m in model.engram_mult]
        for B in (1, 4, 16, 64):
            q = total // B
            ids = torch.randint(3, cfg.vocab_size, (total,), generator=torch.Generator().manual_seed(0))
            nblk = -(-q // 128)
            tables = [[1 + nblk * i + j for j in range(nblk)] for i in range(B)]
            batch = ForwardBatch(ids, [q] * B, [0] * B, tables, list(range(1, B + 1)),
                                 [q * (i + 1) - 1 for i in range(B)])
            cache = V41Cache(cfg, B * nblk + 1, B + 1, "cpu")
            before, mode = len(kernels), KernelOps()
            with mode:
                model(batch, cache)
            triton_launches = len(kernels) - before
            print(f"{B:3d} sequences of {q:3d} tokens: {triton_launches:6,d} Triton launches, {mode.ops:6,d} torch "
                  f"kernel ops, {triton_launches + mode.ops:6,d} in all")


def save(out: str) -> None:
    model = load_model(MODEL, "cpu")
    cfg = model.config
    g = torch.Generator().manual_seed(3)
    lens = [5, 130, 1, 64, 257, 3]
    seqs = [torch.randint(3, cfg.vocab_size, (n + 40,), generator=g).tolist() for n in lens]
    tables = [[1 + 4 * i + j for j in range(4)] for i in range(len(seqs))]
    slots = [2, 5, 1, 6, 3, 4]
    done = [0] * len(seqs)
    cache = V41Cache(cfg, 4 * len(seqs) + 1, 7, "cpu")
    logits = {}
    carry, model.decode_carry = model.decode_carry, None  # decode rows take the general path too
    plan = {"prefill": [(0, 5), (1, 77), (2, 1), (3, 33), (4, 100)], "chunks": [(1, 53), (3, 31), (4, 157), (5, 3)],
            "decode": [(0, 1), (1, 1), (2, 1), (3, 1), (5, 1)], "mixed": [(0, 7), (2, 6), (4, 2), (5, 4)],
            "replay": [(1, 30), (3, 9), (0, 20)]}
    for name, chunks in plan.items():
        model.prefill_keep_tokens = cfg.sliding_window if name == "replay" else None
        ids, q, c, rows = [], [], [], []
        for i, n in chunks:
            ids += seqs[i][done[i]: done[i] + n]
            q.append(n), c.append(done[i]), rows.append(sum(q) - 1)
            done[i] += n
        batch = ForwardBatch(torch.tensor(ids), q, c, [tables[i] for i, _ in chunks], [slots[i] for i, _ in chunks],
                             rows)
        logits[name] = model(batch, cache)
    model.decode_carry, model.prefill_keep_tokens = carry, None
    state = {"logits": logits, "engram_history": cache.engram_history,
             "publisher": torch.tensor(cache.index_k_publisher)}
    for name in ("window", "compressed_kv", "index_k", "comp_kv_state", "comp_score_state"):
        state.update({f"{name}[{lid}]": t for lid, t in getattr(cache, name).items()})
    torch.save(state, out)


def compare(a_path: str, b_path: str) -> None:
    a, b = torch.load(a_path), torch.load(b_path)
    for name in a["logits"]:
        print(f"logits {name}: {'equal' if torch.equal(a['logits'][name], b['logits'][name]) else 'DIFFER'}")
    W = load_model(MODEL, "cpu").config.sliding_window
    for key in sorted(set(a) - {"logits"}):
        rows = (a[key] != b[key]).reshape(a[key].shape[0], -1).any(1).nonzero().flatten()
        per_slot = W if key.startswith("window") else 1  # slot s holds rows s*W.. of a ring, row s of a state
        slot_0 = key.startswith(("window", "comp_", "engram", "publisher"))
        others = rows[rows >= per_slot] if slot_0 else rows
        print(f"{key}: {'equal' if not len(others) else f'{len(others)} rows DIFFER'}"
              + (f" (slot 0, the sentinel: {len(rows) - len(others)} rows differ)" if len(rows) - len(others) else ""))


if __name__ == "__main__":
    {"count": count, "launches": launches, "save": save, "compare": compare}[sys.argv[1]](*sys.argv[2:])
