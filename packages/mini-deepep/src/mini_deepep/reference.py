"""Single-process pure-torch reference of dispatch and combine over all ranks at once (the test oracle).

Written as plain loops over (rank, token, k) so it shares nothing with the backends' vectorised
layout code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ReferenceReceive(NamedTuple):
    """What one rank must receive: the valid rows in order, and where each expert segment starts."""

    sources: list[tuple[int, int, int]]  # (source rank, source token, k) of each valid row, in row order
    rows: list[int]  # output row index of each entry of `sources`
    grouped_layout: torch.Tensor  # int32 [M], -1 for padding
    num_tokens_per_expert: torch.Tensor  # int32 [E_l]


def reference_receive(
    topk_idx_per_rank: list[torch.Tensor], rank: int, num_experts: int, m_alignment: int
) -> ReferenceReceive:
    """The exact receive layout of `rank`: per local expert, (source rank, token) ascending, aligned segments."""
    num_ranks = len(topk_idx_per_rank)
    per_rank = num_experts // num_ranks
    by_expert: list[list[tuple[int, int, int]]] = [[] for _ in range(per_rank)]
    for src, topk in enumerate(topk_idx_per_rank):
        for t, row in enumerate(topk.tolist()):
            for k, e in enumerate(row):
                if e >= 0 and e // per_rank == rank:
                    by_expert[e - rank * per_rank].append((src, t, k))
    sources, rows, layout, start = [], [], [], 0
    for e, entries in enumerate(by_expert):
        size = -(-len(entries) // m_alignment) * m_alignment
        sources += entries
        rows += range(start, start + len(entries))
        layout += [e] * len(entries) + [-1] * (size - len(entries))
        start += size
    counts = torch.tensor([len(v) for v in by_expert], dtype=torch.int32)
    return ReferenceReceive(sources, rows, torch.tensor(layout, dtype=torch.int32), counts)


def reference_combine(
    expert_out: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, num_ranks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine for one rank's tokens: (emulated bf16 result, fp64 exact sum), both [T, hidden].

    expert_out: bf16 [T, num_topk, hidden], the expert output of each (token, k) pair (ignored where
    topk_idx is -1). The emulation follows the documented arithmetic exactly: per expert rank,
    partial = bf16(fp32 sum over its k, in k order, of w * y); out = bf16(fp32 sum of the partials in
    expert-rank order).
    """
    per_rank = num_experts // num_ranks
    num_tokens, num_topk, hidden = expert_out.shape
    total = torch.zeros(num_tokens, hidden, dtype=torch.float32)
    exact = torch.zeros(num_tokens, hidden, dtype=torch.float64)
    for dest in range(num_ranks):
        partial = torch.zeros(num_tokens, hidden, dtype=torch.float32)
        for k in range(num_topk):
            here = ((topk_idx[:, k] >= 0) & (topk_idx[:, k] // per_rank == dest))[:, None]
            w, y = topk_weights[:, k, None], expert_out[:, k]
            partial = torch.where(here, partial + y.float() * w.float(), partial)
            exact += torch.where(here, y.double() * w.double(), 0.0)
        total = total + partial.to(torch.bfloat16).float()
    return total.to(torch.bfloat16), exact
