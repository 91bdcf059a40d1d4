"""Multi-rank correctness scenarios, shared by the CPU (gloo) tests and the 2-GPU (NVSHMEM) tests.

Every rank regenerates every rank's inputs from the scenario seed, so it can build the reference for
its own receive and combine without extra communication. Checks:
- dispatch data movement is exact: each valid row equals its source token's bytes, its weight, and
  the layout (grouped_layout, counts, row order) equals `reference_receive`;
- combine is within two bf16 roundings of the exact sum: |out - sum_k w y| <= 1.01 * 2^-7 * sum_k |w y|
  (one rounding, u = 2^-8, of each rank's partial and one of the total); with `exact_combine` it must also equal
  the documented arithmetic bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_deepep.buffer import Buffer
from mini_deepep.reference import reference_combine, reference_receive


@dataclass(frozen=True)
class Scenario:
    name: str
    tokens_per_rank: tuple[int, ...]  # indexed by rank; uneven and zero allowed
    hidden: int = 256
    num_experts: int = 384
    num_topk: int = 6
    fp8: bool = False
    m_alignment: int = 128
    fixed_rows: bool = False  # pass num_max_recv_rows (the no-host-sync path)
    seed: int = 0


def cpu_scenarios(num_ranks: int) -> list[Scenario]:
    def tokens(*counts: int) -> tuple[int, ...]:
        return tuple(counts[r % len(counts)] + 3 * r for r in range(num_ranks))

    return [
        Scenario("uneven bf16", tokens(97, 203), seed=1),
        Scenario("fp8 payload", tokens(150, 61), fp8=True, seed=2),
        Scenario("rank with zero tokens", (0,) + tokens(75)[1:], seed=3),
        Scenario("fixed rows, alignment 8", tokens(64, 40), m_alignment=8, fixed_rows=True, seed=4),
    ]


def gpu_scenarios(num_ranks: int) -> list[Scenario]:
    return cpu_scenarios(num_ranks) + [
        Scenario("large bf16", tuple(1024 - 247 * r for r in range(num_ranks)), hidden=1024, seed=5),
        Scenario("large fp8", tuple(1024 - 300 * r for r in range(num_ranks)), hidden=1024, fp8=True, seed=6),
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


def run_scenario(buffer: Buffer, s: Scenario, device: torch.device, exact_combine: bool) -> None:
    rank, num_ranks = buffer.rank, buffer.num_ranks
    per_rank = s.num_experts // num_ranks
    inputs = [make_inputs(s, r, num_ranks) for r in range(num_ranks)]
    x, topk, weights = inputs[rank]
    if s.fp8:
        from mini_deepgemm.reference import act_dequant, act_quant

        payloads = [act_quant(inp[0], 32) for inp in inputs]
        send = tuple(p.to(device) for p in payloads[rank])
        source_rows = [act_dequant(*p) for p in payloads]
    else:
        send = x.to(device)
        source_rows = [inp[0] for inp in inputs]

    ref = reference_receive([inp[1] for inp in inputs], rank, s.num_experts, s.m_alignment)
    max_rows = sum(s.tokens_per_rank) * s.num_topk + per_rank * (s.m_alignment - 1)
    result = buffer.dispatch(
        send, topk.to(device), weights.to(device), s.num_experts,
        m_alignment=s.m_alignment, num_max_recv_rows=max_rows if s.fixed_rows else None,
    )
    handle = result.handle

    # Layout: exactly the reference's (with the fixed size, the tail past the used rows is padding).
    num_rows = ref.grouped_layout.numel()
    layout = result.grouped_layout.cpu()
    assert int(handle.num_recv_rows) == num_rows, (s.name, int(handle.num_recv_rows), num_rows)
    assert torch.equal(layout[:num_rows], ref.grouped_layout), s.name
    assert bool((layout[num_rows:] == -1).all()), s.name
    assert torch.equal(result.num_recv_tokens_per_expert.cpu(), ref.num_tokens_per_expert), s.name
    src_rank, src_token, src_k = (v.cpu() for v in handle.row_sources())
    rows = torch.tensor(ref.rows, dtype=torch.long)
    expected = torch.tensor(ref.sources, dtype=torch.int32).reshape(-1, 3)
    got = torch.stack([src_rank[rows], src_token[rows], src_k[rows]], 1)
    assert torch.equal(got, expected), s.name

    # Data movement: bit-exact payload and weight for every valid row.
    parts = result.recv_x if s.fp8 else (result.recv_x,)
    for part_idx, part in enumerate(parts):
        part = part.cpu().view(torch.uint8)  # compared as bytes: indexing lacks some FP8 dtypes
        for r in range(num_ranks):
            sel = expected[:, 0] == r
            src = (payloads[r][part_idx] if s.fp8 else inputs[r][0]).view(torch.uint8)
            assert torch.equal(part[rows[sel]], src[expected[sel, 1].long()]), (s.name, part_idx, r)
    want_w = torch.stack([inputs[r][2][t, k] for r, t, k in ref.sources]) if ref.sources else torch.zeros(0)
    assert torch.equal(result.recv_topk_weights.cpu()[rows], want_w), s.name
    assert bool((result.recv_topk_weights.cpu()[layout < 0] == 0).all()), s.name

    # Combine: the stand-in experts run on the received rows; padding rows get garbage on purpose.
    recv_rows = act_dequant(parts[0].cpu(), parts[1].cpu()) if s.fp8 else parts[0].float()
    y = expert_fn(recv_rows.to(device), result.grouped_layout.clamp(min=0))
    y[result.grouped_layout < 0] = float("nan")
    out = buffer.combine(y, handle).cpu()
    local_expert = topk % per_rank
    expert_out = torch.stack([expert_fn(source_rows[rank], local_expert[:, k]) for k in range(s.num_topk)], 1)
    emulated, exact = reference_combine(expert_out, topk, weights, s.num_experts, num_ranks)
    assert out.shape == (s.tokens_per_rank[rank], s.hidden) and out.dtype == torch.bfloat16, s.name
    routed = (topk >= 0)[:, :, None]
    bound = torch.where(routed, expert_out.double() * weights.double()[:, :, None], 0.0).abs().sum(1)
    err = (out.double() - exact).abs()
    assert bool((err <= bound * (1.01 * 2**-7)).all()), (s.name, float((err - bound * (1.01 * 2**-7)).max()))
    if exact_combine:
        assert torch.equal(out, emulated), s.name
    assert not buffer.timed_out(), s.name


def run_all(buffer: Buffer, scenarios: list[Scenario], device: torch.device, exact_combine: bool, repeats: int = 2) -> int:
    """Run every scenario `repeats` times on the same buffer (exercises buffer reuse); returns the count run."""
    for _ in range(repeats):
        for s in scenarios:
            run_scenario(buffer, s, device, exact_combine)
    return repeats * len(scenarios)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, num_ranks: int, port: int, buffer_backends: tuple[str, ...], num_nvl_bytes: int, on_gpu: bool) -> None:
    import torch.distributed as dist

    if on_gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # the ranks share the machine's cores
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks,
        **({"device_id": device} if on_gpu else {}),
    )
    scenarios = gpu_scenarios(num_ranks) if on_gpu else cpu_scenarios(num_ranks)
    try:
        for backend in buffer_backends:
            # The context manager frees the symmetric memory and finalises NVSHMEM when done.
            with Buffer(None, num_nvl_bytes, backend=backend) as buffer:
                assert buffer.backend_name == backend
                run_all(buffer, scenarios, device, exact_combine=backend == "torch")
    finally:
        dist.destroy_process_group()


def spawn_ranks(num_ranks: int, buffer_backends: tuple[str, ...], num_nvl_bytes: int = 0, on_gpu: bool = False) -> None:
    """Run every scenario on `num_ranks` spawned processes (gloo on CPU, NCCL + one GPU each on GPU); raises on failure."""
    import torch.multiprocessing as mp

    # fork saves re-importing torch on CPU; CUDA cannot be forked.
    mp.start_processes(
        _rank_main, args=(num_ranks, free_port(), buffer_backends, num_nvl_bytes, on_gpu),
        nprocs=num_ranks, start_method="spawn" if on_gpu else "fork",
    )
