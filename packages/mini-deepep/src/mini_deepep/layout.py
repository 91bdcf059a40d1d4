"""Routing layouts: who sends what where, and where received rows land.

Everything here has fixed output shapes (no `nonzero`, no `.item()`), so it never synchronises with
the host (except `plan_expert_segments` when asked for an exact row count) and is shared by both
backends. It is plain torch and runs on any device, except `get_dispatch_layout` on CUDA, which runs
two Triton kernels (kernels/layout.py) instead of ~10 launch-bound torch ops; its torch form,
`get_dispatch_layout_torch`, stays as the CPU path and the kernels' oracle.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class DispatchLayout(NamedTuple):
    """What one rank sends, computed from its own top-k routing only.

    num_tokens_per_rank: int32 [num_ranks], tokens with at least one expert on each rank.
    num_tokens_per_expert: int32 [num_experts], tokens routed to each (global) expert.
    is_token_in_rank: bool [num_tokens, num_ranks], token t goes to rank r (once, however many of
        r's experts it picked).
    send_slot: int32 [num_tokens, num_ranks], index of token t among the tokens sent to rank r
        (token order), -1 if not sent: its row in r's receive area, and where its partial returns.
    rank_in_expert: int32 [num_tokens, num_topk], how many earlier tokens of this rank picked the
        same expert (-1 for no expert): with the counts, the pair's row inside the expert segment.
    """

    num_tokens_per_rank: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    is_token_in_rank: torch.Tensor
    send_slot: torch.Tensor
    rank_in_expert: torch.Tensor


class ExpertSegments(NamedTuple):
    """Where each received (token, k) pair lands in the expert-grouped receive layout.

    positions: int32 [num_recv_tokens, num_topk], output row of each pair, -1 where the pair is
        not for this rank.
    grouped_layout: int32 [num_rows], local expert id of each output row, -1 for padding rows.
    num_tokens_per_expert: int32 [num_local_experts], valid rows per local expert.
    num_rows: int32 [] (device), rows actually used (sum of the aligned segment sizes).
    """

    positions: torch.Tensor
    grouped_layout: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    num_rows: torch.Tensor


@functools.cache
def _triton_available() -> bool:
    """triton is optional (the CPU path needs only torch); looked up once, not on every call."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> DispatchLayout:
    """Count tokens per rank and per expert.

    topk_idx: int [num_tokens, num_topk], global expert ids, -1 = no expert. Experts are split into
    `num_ranks` contiguous blocks of num_experts / num_ranks (rank r owns experts
    [r * E_l, (r + 1) * E_l)). The experts of one token are expected to be distinct.
    CUDA tensors (with triton installed) take the Triton kernels, others `get_dispatch_layout_torch`;
    both give the same outputs bit for bit.
    """
    if topk_idx.is_cuda and _triton_available():
        from mini_deepep.kernels.layout import dispatch_layout

        return dispatch_layout(topk_idx, num_experts, num_ranks)
    return get_dispatch_layout_torch(topk_idx, num_experts, num_ranks)


def get_dispatch_layout_torch(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> DispatchLayout:
    """`get_dispatch_layout` in plain torch ops (any device): the CPU path and the oracle of the kernels."""
    experts_per_rank = split_experts(num_experts, num_ranks)
    num_tokens = topk_idx.shape[0]
    valid = topk_idx >= 0
    # Invalid entries go to one extra column that is sliced away, which keeps every shape fixed.
    expert = torch.where(valid, topk_idx, num_experts).long()
    # picked[e, t] = 1 if token t chose expert e; expert-major so the running count is a
    # contiguous scan (a scan down the token axis of [T, E] was ~1 ms on H200 at T=4096).
    picked = torch.zeros(num_experts + 1, num_tokens, dtype=torch.int32, device=topk_idx.device)
    picked.scatter_(0, expert.T, 1)
    earlier = torch.cumsum(picked, 1, dtype=torch.int32) - picked
    rank_in_expert = torch.where(valid, earlier.gather(0, expert.T).T, -1)
    rank = torch.where(valid, topk_idx.long() // experts_per_rank, num_ranks)
    in_rank = torch.zeros(num_tokens, num_ranks + 1, dtype=torch.bool, device=topk_idx.device)
    in_rank.scatter_(1, rank, True)
    in_rank = in_rank[:, :num_ranks].contiguous()
    return DispatchLayout(
        in_rank.sum(0, dtype=torch.int32), picked.sum(1, dtype=torch.int32)[:num_experts], in_rank,
        send_slots(in_rank), rank_in_expert,
    )


def split_experts(num_experts: int, num_ranks: int) -> int:
    """Experts per rank (rank r owns [r * E_l, (r + 1) * E_l)); ValueError unless they split evenly."""
    if num_experts % num_ranks != 0:
        raise ValueError(f"num_experts={num_experts} is not divisible by num_ranks={num_ranks}")
    return num_experts // num_ranks


def send_slots(is_token_in_rank: torch.Tensor) -> torch.Tensor:
    """int32 [num_tokens, num_ranks]: index of token t among the tokens sent to rank r (token order), -1 if not sent.

    This is the row the token occupies in r's receive area for this sender, and the row its combined
    partial comes back to.
    """
    rank_of_token = torch.cumsum(is_token_in_rank.to(torch.int32), dim=0, dtype=torch.int32) - 1
    return torch.where(is_token_in_rank, rank_of_token, -1)


def local_expert_ids(topk_idx: torch.Tensor, rank: torch.Tensor | int, experts_per_rank: int) -> torch.Tensor:
    """int32 [..., num_topk]: expert ids rebased to `rank`'s local numbering, -1 for experts elsewhere (or none)."""
    local = topk_idx.long() - torch.as_tensor(rank, device=topk_idx.device).long().unsqueeze(-1) * experts_per_rank
    mine = (topk_idx >= 0) & (local >= 0) & (local < experts_per_rank)
    return torch.where(mine, local, -1).to(torch.int32)


def plan_expert_segments(
    recv_expert_ids: torch.Tensor,
    num_local_experts: int,
    m_alignment: int,
    num_rows: int | None = None,
) -> ExpertSegments:
    """Lay received (token, k) pairs out as mini-deepgemm's contiguous grouped-GEMM input.

    recv_expert_ids: int [num_recv_tokens, num_topk], local expert id of each pair, -1 for pairs that
        are not for this rank. Received tokens must be ordered by (source rank, source token): the
        layout keeps that order inside each expert segment (a stable sort), so it is deterministic.
    m_alignment: every expert segment starts at a multiple of it (padding rows in between).
    num_rows: the caller's fixed output row count (no host sync, CUDA-graph friendly; pairs that do
        not fit are dropped and `num_rows` of the result exceeds it), or None for the exact count
        (one device-to-host read).
    """
    device = recv_expert_ids.device
    flat = recv_expert_ids.reshape(-1).long()
    valid = flat >= 0
    key = torch.where(valid, flat, num_local_experts)  # invalid pairs sort last
    counts = torch.zeros(num_local_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    sorted_key, order = torch.sort(key, stable=True)
    first_of_key = torch.cumsum(counts, 0) - counts
    aligned = (counts + m_alignment - 1) // m_alignment * m_alignment
    aligned[num_local_experts:].zero_()  # a device fill: `aligned[i] = 0` copies a CPU scalar (breaks graph capture)
    segment_start = torch.cumsum(aligned, 0) - aligned
    total_rows = aligned.sum()
    rank_in_segment = torch.arange(flat.numel(), device=device) - first_of_key[sorted_key]
    sorted_position = segment_start[sorted_key] + rank_in_segment
    position = torch.empty_like(sorted_position)
    position[order] = sorted_position
    rows = int(total_rows) if num_rows is None else num_rows
    position = torch.where(valid & (position < rows), position, -1)

    # Scatter the expert ids; dropped pairs go to a spare row past the end that is sliced away.
    grouped_layout = torch.full((rows + 1,), -1, dtype=torch.int32, device=device)
    grouped_layout.scatter_(0, torch.where(position >= 0, position, rows), key.to(torch.int32))
    return ExpertSegments(
        position.to(torch.int32).view(recv_expert_ids.shape),
        grouped_layout[:rows],
        counts[:num_local_experts].to(torch.int32),
        total_rows.to(torch.int32),
    )


def scatter_rows_values(positions: torch.Tensor, values: torch.Tensor, num_rows: int, fill: float) -> torch.Tensor:
    """[num_rows] tensor with values[i, k] at positions[i, k] (where >= 0) and `fill` elsewhere (padding rows)."""
    flat_pos = positions.reshape(-1).long()
    out = torch.full((num_rows + 1,), fill, dtype=values.dtype, device=values.device)
    out.scatter_(0, torch.where(flat_pos >= 0, flat_pos, num_rows), values.reshape(-1))
    return out[:num_rows]
