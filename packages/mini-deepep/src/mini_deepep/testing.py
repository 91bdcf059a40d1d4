"""Multi-rank correctness scenarios, shared by the CPU (gloo) tests and the 2-GPU (NVSHMEM) tests.

Every rank regenerates every rank's inputs from the scenario seed, so it can build the reference for
its own receive and combine without extra communication. Checks:
- dispatch data movement is exact: each valid row equals its source token's bytes, its weight, and
  the layout (grouped_layout, counts, row order) equals `reference_receive`;
- combine is within two bf16 roundings of the exact sum: |out - sum_k w y| <= 1.01 * 2^-7 * sum_k |w y|
  (one rounding, u = 2^-8, of each rank's partial and one of the total); with `exact_combine` it must also equal
  the documented arithmetic bit for bit.
- no NVSHMEM wait timed out, checked before the data (a wait that gives up leaves stale data, which
  would otherwise be reported as a wrong row).
Failure messages name the backend, rank, scenario and round, and list the failing rows (with the
(source rank, token, k) each should hold) or tokens (with the ranks their experts are on), so one
GPU log tells a misplaced row from a stale partial or a timed-out wait.

`run_stress` drives calls back to back, without host syncs and with seeded lags, to expose ordering bugs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mini_deepep.buffer import Buffer
from mini_deepep.handle import DispatchHandle, DispatchResult, Payload
from mini_deepep.reference import ReferenceReceive, reference_combine, reference_receive

# Failing rows or tokens listed in a message (the count is always given).
MAX_LISTED = 8


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens_per_rank: tuple[int, ...]  # indexed by rank; uneven and zero allowed
    hidden: int = 256
    num_experts: int = 384
    num_topk: int = 6
    fp8: bool = False
    fold_128: bool = False  # with fp8: float32 scales per 128 (mini-deepgemm's fold_128) instead of UE8M0 per 32
    m_alignment: int = 128
    fixed_rows: bool = False  # pass num_max_recv_rows (the no-host-sync path)
    seed: int = 0


def _uneven_tokens(num_ranks: int, *counts: int) -> tuple[int, ...]:
    return tuple(counts[r % len(counts)] + 3 * r for r in range(num_ranks))


def cpu_scenarios(num_ranks: int) -> list[Scenario]:
    def tokens(*counts: int) -> tuple[int, ...]:
        return _uneven_tokens(num_ranks, *counts)

    return [
        Scenario("uneven bf16", tokens(97, 203), seed=1),
        Scenario("fp8 payload", tokens(150, 61), fp8=True, seed=2),
        Scenario("fp8 payload folded per 128", tokens(83, 120), fp8=True, fold_128=True, seed=9),
        Scenario("rank with zero tokens", (0,) + tokens(75)[1:], seed=3),
        Scenario("fixed rows, alignment 8", tokens(64, 40), m_alignment=8, fixed_rows=True, seed=4),
    ]


def gpu_scenarios(num_ranks: int) -> list[Scenario]:
    return cpu_scenarios(num_ranks) + [
        Scenario("large bf16", tuple(1024 - 247 * r for r in range(num_ranks)), hidden=1024, seed=5),
        Scenario("large fp8", tuple(1024 - 300 * r for r in range(num_ranks)), hidden=1024, fp8=True, seed=6),
        # Not a power of two: every row is two pieces with data in both (dispatch.load_rows).
        Scenario("bf16, hidden 640", tuple(700 - 173 * r for r in range(num_ranks)), hidden=640, seed=7),
        Scenario("fp8, hidden 640", tuple(640 - 111 * r for r in range(num_ranks)), hidden=640, fp8=True, seed=8),
        Scenario("fp8 folded per 128, hidden 640", tuple(640 - 111 * r for r in range(num_ranks)), hidden=640,
                 fp8=True, fold_128=True, seed=10),
    ]


def stress_scenarios(num_ranks: int) -> list[Scenario]:
    """Consecutive entries differ in payload kind, hidden size, token counts, alignment and row-count
    mode, so each call lays the symmetric buffer out differently from the one before it (a write
    that lands before the peer finished reading shows up as a wrong row). At most 1024 tokens of
    hidden 1024 per rank (the tests' buffer size)."""
    return [
        Scenario("stress large bf16, fixed rows", tuple(1024 - 247 * r for r in range(num_ranks)), hidden=1024,
                 fixed_rows=True, seed=21),
        Scenario("stress fp8, exact rows", _uneven_tokens(num_ranks, 150, 61), fp8=True, seed=22),
        Scenario("stress small bf16, alignment 8, fixed rows", _uneven_tokens(num_ranks, 97, 203), m_alignment=8,
                 fixed_rows=True, seed=23),
        Scenario("stress large fp8, fixed rows", tuple(1024 - 300 * r for r in range(num_ranks)), hidden=1024,
                 fp8=True, fixed_rows=True, seed=24),
        Scenario("stress rank with zero tokens, fixed rows", (0,) + _uneven_tokens(num_ranks, 75)[1:],
                 fixed_rows=True, seed=25),
    ]


def make_inputs(s: Scenario, src_rank: int, num_ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x bf16 [T, hidden], topk_idx int64 [T, k], topk_weights fp32 [T, k]) of one rank, on CPU.

    Random distinct experts per token, plus edge cases: every 7th token only uses experts of the
    last rank (so it reaches no other rank), every 11th drops its last two experts (-1), every 13th
    is routed nowhere.
    """
    gen = torch.Generator().manual_seed(1000 * s.seed + src_rank)
    num_tokens, per_rank = s.tokens_per_rank[src_rank], s.num_experts // num_ranks
    x = torch.randn(num_tokens, s.hidden, generator=gen).to(torch.bfloat16)
    topk = torch.rand(num_tokens, s.num_experts, generator=gen).argsort(1)[:, : s.num_topk]
    last_rank_only = torch.rand(num_tokens, per_rank, generator=gen).argsort(1)[:, : s.num_topk] + (num_ranks - 1) * per_rank
    t = torch.arange(num_tokens)[:, None]
    topk = torch.where(t % 7 == 3, last_rank_only, topk)
    topk = torch.where((t % 11 == 5) & (torch.arange(s.num_topk) >= s.num_topk - 2), -1, topk)
    topk = torch.where(t % 13 == 0, -1, topk)
    weights = torch.rand(num_tokens, s.num_topk, generator=gen)
    return x, topk, weights


def expert_fn(rows: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
    """A stand-in expert: bf16(x * (1 + e / 64)), so every expert's output differs."""
    return (rows.float() * (1 + local_expert.float()[:, None] / 64)).to(torch.bfloat16)


def stand_in_expert_outputs(recv_rows: torch.Tensor, grouped_layout: torch.Tensor) -> torch.Tensor:
    """expert_fn of each received row; padding rows get NaN on purpose (combine must ignore them).

    torch.where, not a masked assignment: a boolean-mask write syncs with the host (nonzero)."""
    y = expert_fn(recv_rows, grouped_layout.clamp(min=0))
    return torch.where((grouped_layout < 0)[:, None], torch.full_like(y, float("nan")), y)


def _payload_rows(parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """fp32 rows the experts compute on: x itself, or act_dequant of the FP8 (x, scales), on the parts' device."""
    if len(parts) == 1:
        return parts[0].float()
    from mini_deepgemm.reference import act_dequant

    q, scales = parts
    return act_dequant(q, scales, 128 if scales.dtype == torch.float32 else 32)  # float32: folded per 128


@dataclass
class ScenarioData:
    """A scenario's inputs for every rank (CPU), regenerated from the seed on each rank."""

    inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (x, topk_idx, topk_weights) per rank
    payloads: list[tuple[torch.Tensor, ...]]  # what each rank sends: (x,), act_quant(x, 32) or that folded per 128
    source_rows: list[torch.Tensor]  # fp32 rows the experts see of each rank's tokens


def scenario_data(s: Scenario, num_ranks: int) -> ScenarioData:
    inputs = [make_inputs(s, r, num_ranks) for r in range(num_ranks)]
    if s.fp8:
        from mini_deepgemm.reference import act_quant, fold_ue8m0_to_128

        payloads = [tuple(act_quant(inp[0], 32)) for inp in inputs]
        if s.fold_128:
            payloads = [fold_ue8m0_to_128(q, scales, 1) for q, scales in payloads]
    else:
        payloads = [(inp[0],) for inp in inputs]
    return ScenarioData(inputs, payloads, [_payload_rows(p) for p in payloads])


def _max_rows(s: Scenario, num_ranks: int) -> int:
    """A fixed row count that always fits (every pair, plus the worst alignment padding)."""
    return sum(s.tokens_per_rank) * s.num_topk + s.num_experts // num_ranks * (s.m_alignment - 1)


def _dispatch(buffer: Buffer, s: Scenario, send: Payload, topk: torch.Tensor, weights: torch.Tensor) -> DispatchResult:
    return buffer.dispatch(
        send, topk, weights, s.num_experts, m_alignment=s.m_alignment,
        num_max_recv_rows=_max_rows(s, buffer.num_ranks) if s.fixed_rows else None,
    )


def _listed(indices: torch.Tensor, describe: Callable[[int], str]) -> str:
    """'N: d(i0); d(i1); ...' for the first MAX_LISTED of `indices` (a 1-D tensor)."""
    shown = "; ".join(describe(int(i)) for i in indices[:MAX_LISTED])
    return f"{indices.numel()}: {shown}{' ...' if indices.numel() > MAX_LISTED else ''}"


def check_not_timed_out(buffer: Buffer, where: str, phase: str) -> None:
    assert not buffer.timed_out(), (
        f"[{where}] an NVSHMEM wait timed out during {phase}: a peer stalled past the buffer's wait_timeout_s or "
        "never signalled; the results of this call and all later ones are stale"
    )


def check_dispatch(where: str, s: Scenario, data: ScenarioData, rank: int, result: DispatchResult) -> ReferenceReceive:
    """Layout, row order, payload bytes and weights of one rank's receive, against the loop reference."""
    handle = result.handle
    ref = reference_receive([inp[1] for inp in data.inputs], rank, s.num_experts, s.m_alignment)

    # Layout: exactly the reference's (with the fixed size, the tail past the used rows is padding).
    num_rows = ref.grouped_layout.numel()
    layout = result.grouped_layout.cpu()
    assert int(handle.num_recv_rows) == num_rows, f"[{where}] num_recv_rows {int(handle.num_recv_rows)}, expected {num_rows}"
    assert layout.numel() >= num_rows, f"[{where}] {layout.numel()} output rows, expected at least {num_rows}"
    wrong = (layout[:num_rows] != ref.grouped_layout).nonzero().flatten()
    assert wrong.numel() == 0, f"[{where}] grouped_layout rows wrong " + _listed(
        wrong, lambda i: f"row {i} = {int(layout[i])}, expected {int(ref.grouped_layout[i])}")
    tail = (layout[num_rows:] != -1).nonzero().flatten() + num_rows
    assert tail.numel() == 0, f"[{where}] rows past the used ones not padding " + _listed(tail, lambda i: f"row {i}")
    got_counts, want_counts = result.num_recv_tokens_per_expert.cpu(), ref.num_tokens_per_expert
    assert torch.equal(got_counts, want_counts), f"[{where}] tokens per expert {got_counts.tolist()}, expected {want_counts.tolist()}"

    src_rank, src_token, src_k = (v.cpu() for v in handle.row_sources())
    rows = torch.tensor(ref.rows, dtype=torch.long)
    expected = torch.tensor(ref.sources, dtype=torch.int32).reshape(-1, 3)
    got = torch.stack([src_rank[rows], src_token[rows], src_k[rows]], 1)
    wrong = (got != expected).any(1).nonzero().flatten()
    assert wrong.numel() == 0, f"[{where}] rows from the wrong (source rank, token, k) " + _listed(
        wrong, lambda i: f"row {int(rows[i])} {tuple(got[i].tolist())}, expected {tuple(expected[i].tolist())}")

    # Data movement: bit-exact payload and weight for every valid row.
    parts = result.recv_x if s.fp8 else (result.recv_x,)
    for part_idx, part in enumerate(parts):
        part = part.cpu().view(torch.uint8)  # compared as bytes: indexing lacks some FP8 dtypes
        for r in range(len(data.inputs)):
            sel = (expected[:, 0] == r).nonzero().flatten()
            src = data.payloads[r][part_idx].view(torch.uint8)
            wrong = (part[rows[sel]] != src[expected[sel, 1].long()]).any(1).nonzero().flatten()
            assert wrong.numel() == 0, f"[{where}] payload part {part_idx} (0 = x, 1 = scales) wrong in rows " + _listed(
                sel[wrong], lambda i: f"row {int(rows[i])} from (rank, token, k) {tuple(expected[i].tolist())}")
    want_w = torch.stack([data.inputs[r][2][t, k] for r, t, k in ref.sources]) if ref.sources else torch.zeros(0)
    got_w = result.recv_topk_weights.cpu()
    wrong = (got_w[rows] != want_w).nonzero().flatten()
    assert wrong.numel() == 0, f"[{where}] weights wrong in rows " + _listed(
        wrong, lambda i: f"row {int(rows[i])} = {float(got_w[rows[i]])}, expected {float(want_w[i])}")
    wrong = ((got_w != 0) & (layout < 0)).nonzero().flatten()
    assert wrong.numel() == 0, f"[{where}] nonzero weights on padding rows " + _listed(wrong, lambda i: f"row {i}")
    return ref


def check_combine(
    where: str, s: Scenario, data: ScenarioData, rank: int, handle: DispatchHandle, out: torch.Tensor, exact_combine: bool
) -> None:
    """One rank's combine output (CPU) against the exact sum (bound), and the emulated arithmetic if `exact_combine`."""
    num_ranks = len(data.inputs)
    per_rank = s.num_experts // num_ranks
    _, topk, weights = data.inputs[rank]
    expert_out = torch.stack([expert_fn(data.source_rows[rank], topk[:, k] % per_rank) for k in range(s.num_topk)], 1)
    emulated, exact = reference_combine(expert_out, topk, weights, s.num_experts, num_ranks)
    assert out.shape == (s.tokens_per_rank[rank], s.hidden) and out.dtype == torch.bfloat16, (
        f"[{where}] combine returned {out.dtype} {tuple(out.shape)}")
    routed = (topk >= 0)[:, :, None]
    bound = torch.where(routed, expert_out.double() * weights.double()[:, :, None], 0.0).abs().sum(1) * (1.01 * 2**-7)
    excess = (out.double() - exact).abs() - bound
    excess = torch.where(excess.isnan(), torch.inf, excess)  # a NaN (e.g. a padding row summed in) fails too
    bad = (excess > 0).any(1).nonzero().flatten()
    send_slot = handle.send_slot.cpu()

    def describe(t: int) -> str:
        col = int(excess[t].argmax())
        ranks = sorted({int(e) // per_rank for e in topk[t].tolist() if e >= 0})
        slots = {r: int(send_slot[t, r]) for r in ranks}
        return (f"token {t} (experts on ranks {ranks}, slots {slots}): excess {float(excess[t, col]):.4g} at col {col}, "
                f"got {float(out[t, col]):.4g}, exact {float(exact[t, col]):.4g}")

    assert bad.numel() == 0, f"[{where}] combine beyond the bound for tokens " + _listed(bad, describe)
    if exact_combine:
        differ = (out != emulated).any(1).nonzero().flatten()
        assert differ.numel() == 0, f"[{where}] combine differs from the emulated arithmetic for tokens " + _listed(
            differ, lambda t: f"token {t}")


def run_scenario(buffer: Buffer, s: Scenario, device: torch.device, exact_combine: bool, label: str = "") -> None:
    """Dispatch, check, stand-in experts, combine, check: one call of each, with host syncs in between."""
    rank, num_ranks = buffer.rank, buffer.num_ranks
    where = f"{buffer.backend_name} rank {rank}: {s.name}{label}"
    data = scenario_data(s, num_ranks)
    _, topk, weights = data.inputs[rank]
    send = tuple(p.to(device) for p in data.payloads[rank])
    result = _dispatch(buffer, s, send if s.fp8 else send[0], topk.to(device), weights.to(device))
    check_not_timed_out(buffer, where, "dispatch")
    check_dispatch(where, s, data, rank, result)

    # The stand-in experts run on the received rows, dequantized on the host like the sources.
    parts = result.recv_x if s.fp8 else (result.recv_x,)
    y = stand_in_expert_outputs(_payload_rows(tuple(p.cpu() for p in parts)).to(device), result.grouped_layout)
    out = buffer.combine(y, result.handle)
    check_not_timed_out(buffer, where, "combine")
    check_combine(where, s, data, rank, result.handle, out.cpu(), exact_combine)


def run_all(buffer: Buffer, scenarios: list[Scenario], device: torch.device, exact_combine: bool, repeats: int = 2) -> int:
    """Run every scenario `repeats` times on the same buffer (exercises buffer reuse); returns the count run."""
    for i in range(repeats):
        for s in scenarios:
            run_scenario(buffer, s, device, exact_combine, label=f" (repeat {i})")
    return repeats * len(scenarios)


def _hold_back(device: torch.device, ms: float, on_gpu: bool) -> None:
    """Delay this rank by `ms`: the host sleeps, or (CUDA) a busy-wait kernel holds the stream."""
    if on_gpu and device.type == "cuda":
        torch.cuda._sleep(int(ms * 2e6))  # ~2 GHz SM clock: cycles per ms, roughly (only the order matters)
    else:
        time.sleep(ms / 1000)


def run_stress(buffer: Buffer, scenarios: list[Scenario], device: torch.device, rounds: int, seed: int = 0) -> int:
    """`rounds` dispatch + combine calls back to back on one buffer, all checked only after the last one.

    No host sync between calls where the scenario fixes the row count (stand-in experts run on the
    device), so a rank's GPU may be several calls ahead of its peer's. Before each dispatch one rank,
    and before the combine the next one, is held back 0-20 ms (seeded, the same on every rank) on the
    host or on its GPU, and the NVLink kernels' program count changes between calls (CUDA). So every
    wait meets both an early and a late peer, and a buffer reused before its reader finished, a
    missing acquire/release or a wrong counter target shows up as a wrong row. Leaves the last
    program count set. Returns `rounds`.
    """
    rank, num_ranks = buffer.rank, buffer.num_ranks
    rng = random.Random(seed)
    data = {s: scenario_data(s, num_ranks) for s in scenarios}
    inputs_on_device = {
        s: (tuple(p.to(device) for p in d.payloads[rank]), d.inputs[rank][1].to(device), d.inputs[rank][2].to(device))
        for s, d in data.items()
    }
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
    launched = []
    for i in range(rounds):
        s = scenarios[i % len(scenarios)]
        late_rank, lag_ms, lag_on_gpu = rng.randrange(num_ranks), rng.uniform(0, 20), rng.random() < 0.5
        num_sms = rng.choice([sm_count, 16, 37]) if sm_count else None
        if num_sms:
            buffer.set_num_sms(num_sms)
        send, topk, weights = inputs_on_device[s]
        if rank == late_rank:
            _hold_back(device, lag_ms, lag_on_gpu)
        result = _dispatch(buffer, s, send if s.fp8 else send[0], topk, weights)
        parts = result.recv_x if s.fp8 else (result.recv_x,)
        y = stand_in_expert_outputs(_payload_rows(parts), result.grouped_layout)
        if rank == (late_rank + 1) % num_ranks:
            _hold_back(device, lag_ms, lag_on_gpu)
        out = buffer.combine(y, result.handle)
        lag = f"rank {late_rank} then {(late_rank + 1) % num_ranks} held {lag_ms:.1f} ms on the {'GPU' if lag_on_gpu else 'host'}"
        launched.append((f"{buffer.backend_name} rank {rank}: stress round {i}, {s.name}, {lag}, num_sms {num_sms}", s, result, out))
    check_not_timed_out(buffer, f"{buffer.backend_name} rank {rank}: stress, {rounds} rounds", "the rounds")
    for where, s, result, out in launched:
        check_dispatch(where, s, data[s], rank, result)
        check_combine(where, s, data[s], rank, result.handle, out.cpu(), exact_combine=False)
    return rounds


def run_lost_peer(buffer: Buffer, device: torch.device) -> None:
    """A peer that never signals (rank 1 skips a combine rank 0 makes) must not hang rank 0.

    Rank 0's wait gives up after about the buffer's wait limit (wall-clock), ERROR is then set on
    both ranks, and a later dispatch + combine on rank 0 alone gives up at once (sticky) instead of
    waiting again. NVSHMEM only (the torch backend has no waits of its own).
    """
    import torch.distributed as dist

    assert buffer.backend_name == "nvshmem", "the lost-peer check needs the NVSHMEM backend"
    rank, num_ranks = buffer.rank, buffer.num_ranks
    limit_s = buffer.wait_timeout_s
    s = cpu_scenarios(num_ranks)[0]
    data = scenario_data(s, num_ranks)
    send, topk, weights = (t.to(device) for t in (data.payloads[rank][0], *data.inputs[rank][1:]))
    result = _dispatch(buffer, s, send, topk, weights)
    y = stand_in_expert_outputs(_payload_rows((result.recv_x,)), result.grouped_layout)
    torch.cuda.synchronize(device)
    assert not buffer.timed_out(), f"rank {rank}: the dispatch before the lost combine timed out"
    dist.barrier()
    if rank == 0:
        start = time.monotonic()
        buffer.combine(y, result.handle)
        torch.cuda.synchronize(device)
        first_s = time.monotonic() - start
        start = time.monotonic()
        again = _dispatch(buffer, s, send, topk, weights)
        buffer.combine(stand_in_expert_outputs(_payload_rows((again.recv_x,)), again.grouped_layout), again.handle)
        torch.cuda.synchronize(device)
        second_s = time.monotonic() - start
        assert 0.8 * limit_s <= first_s <= limit_s + 30, f"the lost combine took {first_s:.1f} s, limit {limit_s} s"
        assert second_s < 0.5 * limit_s, f"after ERROR a call still waited {second_s:.1f} s (limit {limit_s} s)"
    dist.barrier()
    assert buffer.timed_out(), f"rank {rank}: ERROR not set after rank 0's wait gave up"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int, num_ranks: int, port: int, buffer_backends: tuple[str, ...], num_nvl_bytes: int, on_gpu: bool,
    driver: str, rounds: int, wait_timeout_s: float,
) -> None:
    import torch.distributed as dist

    if on_gpu:
        torch.cuda.set_device(rank)
    # The ranks share the machine's cores (with whatever else runs): one thread each, or the host-side
    # checks oversubscribe the CPU and one rank falls seconds behind the other on a loaded machine. A forked CPU rank
    # must stay at one thread anyway: its first multi-threaded op would deadlock in the parent's OpenMP pool.
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks,
        **({"device_id": device} if on_gpu else {}),
    )
    try:
        for backend in buffer_backends:
            # The context manager frees the symmetric memory and finalises NVSHMEM when done.
            with Buffer(None, num_nvl_bytes, backend=backend, wait_timeout_s=wait_timeout_s) as buffer:
                assert buffer.backend_name == backend
                if driver == "scenarios":
                    scenarios = gpu_scenarios(num_ranks) if on_gpu else cpu_scenarios(num_ranks)
                    run_all(buffer, scenarios, device, exact_combine=backend == "torch", repeats=rounds)
                elif driver == "stress":
                    run_stress(buffer, stress_scenarios(num_ranks), device, rounds)
                elif driver == "lost_peer":
                    run_lost_peer(buffer, device)
                else:
                    raise ValueError(f"unknown driver {driver!r}")
    finally:
        dist.destroy_process_group()


def spawn_ranks(
    num_ranks: int,
    buffer_backends: tuple[str, ...],
    num_nvl_bytes: int = 0,
    on_gpu: bool = False,
    *,
    driver: str = "scenarios",
    rounds: int = 2,
    wait_timeout_s: float = 100.0,
) -> None:
    """Run a driver on `num_ranks` spawned processes (gloo on CPU, NCCL + one GPU each on GPU); raises on failure.

    driver: "scenarios" (`run_all`, every scenario `rounds` times, checked after each call),
    "stress" (`run_stress`, `rounds` back-to-back calls) or "lost_peer" (`run_lost_peer`, NVSHMEM).
    wait_timeout_s: the NVSHMEM Buffer's wait limit.
    """
    import torch.multiprocessing as mp

    # fork saves re-importing torch on CPU; CUDA cannot be forked.
    mp.start_processes(
        _rank_main,
        args=(num_ranks, free_port(), buffer_backends, num_nvl_bytes, on_gpu, driver, rounds, wait_timeout_s),
        nprocs=num_ranks, start_method="spawn" if on_gpu else "fork",
    )
