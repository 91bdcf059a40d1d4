"""What dispatch returns, and the handle that combine needs to bring results home."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from mini_deepep.layout import scatter_rows_values

# x in bf16, or (x e4m3 [n, hidden], scales float8_e8m0fnu [n, hidden / 32]) as act_quant(x, 32) returns.
Payload = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@dataclass
class DispatchHandle:
    """Routing state of one dispatch, consumed by `combine`. Device tensors unless noted.

    Receive side ("received tokens" are (source rank, source token) pairs, one per token and
    destination rank, in source-rank then token order; the NVSHMEM backend keeps a fixed number of
    slots per source rank, unused slots have source -1):
      recv_src_rank, recv_src_token: int32 [num_recv_tokens].
      recv_tokens_per_rank: int32 [num_ranks], tokens received from each source rank.
      positions: int32 [num_recv_tokens, num_topk], output row of each (token, k) pair, -1 if not here.
      recv_topk_weights: float32 [num_rows], the dispatched weight of each output row, 0 for padding.
      grouped_layout: int32 [num_rows], local expert id per output row, -1 for padding.
      num_recv_rows: int32 [] rows used (> num_rows means the caller's fixed size was too small).
    Send side:
      is_token_in_rank: bool [num_tokens, num_ranks]; send_slot: int32 [num_tokens, num_ranks], the
      row of each token in each destination's receive order (-1 if not sent).
    """

    num_ranks: int
    num_tokens: int
    num_topk: int
    hidden: int
    is_token_in_rank: torch.Tensor
    send_slot: torch.Tensor
    recv_src_rank: torch.Tensor
    recv_src_token: torch.Tensor
    recv_tokens_per_rank: torch.Tensor
    positions: torch.Tensor
    recv_topk_weights: torch.Tensor
    grouped_layout: torch.Tensor
    num_recv_rows: torch.Tensor

    def row_sources(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(source rank, source token, k) of each output row, int32 [num_rows] each, -1 for padding rows."""
        num_rows = self.grouped_layout.numel()
        k = torch.arange(self.num_topk, dtype=torch.int32, device=self.positions.device).expand_as(self.positions)
        per_pair = (self.recv_src_rank[:, None].expand_as(self.positions), self.recv_src_token[:, None].expand_as(self.positions), k)
        return tuple(scatter_rows_values(self.positions, v.contiguous(), num_rows, -1) for v in per_pair)


class DispatchResult(NamedTuple):
    """Received tokens in mini-deepgemm's contiguous grouped layout (see `Buffer.dispatch`)."""

    recv_x: Payload
    grouped_layout: torch.Tensor
    recv_topk_weights: torch.Tensor
    num_recv_tokens_per_expert: torch.Tensor
    handle: DispatchHandle


def payload_parts(x: Payload) -> list[torch.Tensor]:
    """The payload as a list of 2-D row-aligned tensors ([x] or [x_fp8, scales]), validated."""
    parts = [x] if isinstance(x, torch.Tensor) else list(x)
    if len(parts) == 1 and parts[0].dtype != torch.bfloat16:
        raise TypeError(f"a single-tensor payload must be bfloat16, got {parts[0].dtype}")
    if len(parts) == 2:
        q, s = parts
        folded = s.dtype == torch.float32 and s.shape == (q.shape[0], q.shape[1] // 128)
        if q.dtype != torch.float8_e4m3fn or not (folded or s.shape == (q.shape[0], q.shape[1] // 32)):
            raise TypeError("an FP8 payload is (e4m3 [n, hidden], scales [n, hidden / 32]) as act_quant(x, 32) "
                            "returns, or with float32 scales [n, hidden / 128] folded per 128")
    if len(parts) not in (1, 2) or any(p.dim() != 2 or p.shape[0] != parts[0].shape[0] for p in parts):
        raise ValueError("payload must be x [n, hidden] or (x_fp8 [n, hidden], scales [n, hidden / 32] or float32 "
                         "[n, hidden / 128])")
    return [p.contiguous() for p in parts]


def pack_meta(src_token: torch.Tensor, local_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """int32 [n, 1 + 2 * num_topk]: source token, local expert ids, weights (fp32 bits), sent with each token."""
    return torch.cat([src_token[:, None].to(torch.int32), local_ids.to(torch.int32), weights.float().view(torch.int32)], 1)


def unpack_meta(meta: torch.Tensor, num_topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `pack_meta`: (src_token int32 [n], local_ids int32 [n, k], weights float32 [n, k])."""
    return meta[:, 0], meta[:, 1 : 1 + num_topk], meta[:, 1 + num_topk : 1 + 2 * num_topk].contiguous().view(torch.float32)
