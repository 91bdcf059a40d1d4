"""Dispatch/combine on plain torch.distributed collectives (all_to_all_single).

Runs wherever torch.distributed does (gloo on CPU, NCCL on GPUs). It is the fallback when NVSHMEM
is unavailable and the oracle the NVSHMEM backend is tested against. It synchronises with the host
(split sizes are Python lists), which the NVSHMEM backend avoids.

Each token travels once per destination rank, as one byte row [payload bytes | meta], so a whole
dispatch is one count exchange plus one all_to_all_single; combine is one all_to_all_single of
per-rank partial sums (bf16) back to the source.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mini_deepep.handle import DispatchHandle, DispatchResult, pack_meta, unpack_meta
from mini_deepep.layout import DispatchLayout, local_expert_ids, plan_expert_segments, scatter_rows_values


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


class TorchBackend:
    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)

    def _all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        recv = send.new_empty((sum(recv_counts), *send.shape[1:]))
        dist.all_to_all_single(recv, send, recv_counts, send_counts, group=self.group)
        return recv

    def dispatch(
        self,
        parts: list[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: DispatchLayout,
        num_experts: int,
        m_alignment: int,
        num_max_recv_rows: int | None,
    ) -> DispatchResult:
        num_tokens, num_topk = topk_idx.shape
        experts_per_rank = num_experts // self.num_ranks
        device = topk_idx.device

        # Send order: by destination rank, then token (so each destination's rows are its slot order).
        dest, token = layout.is_token_in_rank.T.nonzero(as_tuple=True)
        send_counts = layout.num_tokens_per_rank.tolist()
        recv_counts_t = torch.empty_like(layout.num_tokens_per_rank)
        dist.all_to_all_single(recv_counts_t, layout.num_tokens_per_rank, group=self.group)
        recv_counts = recv_counts_t.tolist()

        meta = pack_meta(token, local_expert_ids(topk_idx[token], dest, experts_per_rank), topk_weights[token])
        widths = [p.shape[1] * p.element_size() for p in parts]
        rows = torch.cat([_as_bytes(p[token]) for p in parts] + [_as_bytes(meta)], 1)
        recv = self._all_to_all(rows, send_counts, recv_counts)

        src_token, recv_ids, recv_weights = unpack_meta(recv[:, sum(widths) :].contiguous().view(torch.int32), num_topk)
        src_rank = torch.repeat_interleave(torch.arange(self.num_ranks, dtype=torch.int32, device=device), recv_counts_t.long())

        seg = plan_expert_segments(recv_ids, experts_per_rank, m_alignment, num_max_recv_rows)
        num_rows = seg.grouped_layout.numel()
        valid = seg.positions >= 0
        out_rows = seg.positions[valid].long()
        src_of_row = torch.arange(recv.shape[0], device=device)[:, None].expand_as(seg.positions)[valid]
        # Rows are moved as bytes (indexing is not implemented for every FP8 dtype). Padding rows are
        # left unspecified (grouped_layout marks them -1), as in the NVSHMEM backend.
        out_bytes = recv.new_empty((num_rows, sum(widths)))
        out_bytes[out_rows] = recv[src_of_row, : sum(widths)]
        outs, offset = [], 0
        for p, w in zip(parts, widths):
            outs.append(out_bytes[:, offset : offset + w].contiguous().view(p.dtype))
            offset += w

        handle = DispatchHandle(
            num_ranks=self.num_ranks,
            num_tokens=num_tokens,
            num_topk=num_topk,
            hidden=parts[0].shape[1],
            is_token_in_rank=layout.is_token_in_rank,
            send_slot=layout.send_slot,
            recv_src_rank=src_rank,
            recv_src_token=src_token.contiguous(),
            recv_tokens_per_rank=recv_counts_t,
            positions=seg.positions,
            recv_topk_weights=scatter_rows_values(seg.positions, recv_weights, num_rows, 0.0),
            grouped_layout=seg.grouped_layout,
            num_recv_rows=seg.num_rows,
        )
        recv_x = outs[0] if len(outs) == 1 else (outs[0], outs[1])
        return DispatchResult(recv_x, seg.grouped_layout, handle.recv_topk_weights, seg.num_tokens_per_expert, handle)

    def combine(self, y: torch.Tensor, handle: DispatchHandle, row_weights: torch.Tensor) -> torch.Tensor:
        # Expert side: one fp32 partial per received token over its local k, in k order, rounded to bf16.
        partial = torch.zeros(handle.positions.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
        for k in range(handle.num_topk):
            here = handle.positions[:, k] >= 0
            rows = handle.positions[here, k].long()
            partial[here] = partial[here] + y[rows].float() * row_weights[rows, None]
        partial = partial.to(torch.bfloat16)

        # Back to the sources; what arrives is ordered by expert rank, then token.
        send_counts = handle.is_token_in_rank.sum(0).tolist()
        recv_counts = torch.bincount(handle.recv_src_rank.long(), minlength=self.num_ranks).tolist()
        back = self._all_to_all(_as_bytes(partial), recv_counts, send_counts).view(torch.bfloat16)

        # Source side: add the partials of each rank in rank order, in fp32.
        dest, token = handle.is_token_in_rank.T.nonzero(as_tuple=True)
        out = torch.zeros(handle.num_tokens, y.shape[1], dtype=torch.float32, device=y.device)
        for r in range(self.num_ranks):
            mine = dest == r
            out.index_add_(0, token[mine], back[mine].float())
        return out.to(torch.bfloat16)
