"""EP x DP for V4.1: one process per GPU, each with its own batch; routed experts and Engram rows sharded.

Attention, hyper-connections, the shared expert and every dense layer are replicated, so a rank computes them for
its own tokens only. Two kinds of layer hold a shard of their weights and talk to the other ranks:

- MoE: rank r owns routed experts [r * E / R, (r + 1) * E / R). Tokens are routed locally, sent to the ranks that
  own their experts with mini_deepep.Buffer.dispatch (as FP8 rows), computed there by the grouped expert GEMMs over
  the local experts (moe.grouped_expert_ffn), and brought back by Buffer.combine; the shared expert runs locally on
  the rank's own tokens.
- Engram: rank r owns table rows [r * N // R, (r + 1) * N // R). Every rank's row ids are all-gathered,
  each rank fills the rows it owns (zeros elsewhere) as raw bytes (e4m3 row + UE8M0 scales), and a uint8
  reduce-scatter brings every rank the rows of its own ids. Each row has exactly one owner, so the sum is x + 0 +
  ... = x: the rows arrive bit-exact and the rest of the Engram layer runs locally, unchanged.

Both layers are collective, so every rank must run them in the same order every step: a rank with no tokens calls
`forward` with an empty ForwardBatch, which joins the same collectives with zero rows (`idle_forward`).

Numerics of the MoE against the single-process ops.moe (which adds the bf16 routed outputs in fp32 in expert-id
order, adds the shared expert in fp32 and rounds once to bf16): here each expert rank adds its own experts' bf16
outputs in fp32 in top-k slot order and rounds that partial to bf16; the token's rank adds the partials in rank
order in fp32 and rounds to bf16 (mini-deepep's combine); then the shared expert is added in fp32 and rounded. So
the routed part carries two extra bf16 roundings (u = 2^-8 each, relative to the sum of |terms|) and another fp32
summation order. Expert outputs themselves are the same per row (same activation quant, same weights; on
GPU, as far as the GEMM's per-row result does not depend on how many rows it is given).
With `exact_moe=True` every (token, expert) output comes home on its own (one combine per top-k slot, with weight
1 on that slot's rows and 0 elsewhere, so each partial and each sum has a single nonzero term and no rounding)
and the token's rank adds them in expert-id order exactly like ops.moe: bit-identical to the single-process model
at num_topk times the combine traffic. The tiny random model amplifies one extra bf16 rounding of the routed sum
into logit differences above 1 (docs/reports/runtime-ep-dp.md), so end-to-end token equality needs that mode.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mini_deepep import Buffer
from mini_deepep.handle import DispatchHandle
from mini_deepgemm import get_m_alignment_for_contiguous_layout, per_token_group_quant_fp8

from mini_deepinfer.models.deepseek_v41 import moe, ops
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.config import V41Config
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.worker.forward_batch import ForwardBatch


def expert_range(num_experts: int, rank: int, world_size: int) -> range:
    """The routed experts rank `rank` owns (mini-deepep's contiguous split; E must divide evenly)."""
    if num_experts % world_size:
        raise ValueError(f"{num_experts} routed experts cannot be split evenly over {world_size} ranks")
    per_rank = num_experts // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def row_range(num_rows: int, rank: int, world_size: int) -> range:
    """The Engram table rows rank `rank` owns: [r * N // R, (r + 1) * N // R), floor(N / R) or one more each."""
    if num_rows < world_size:
        raise ValueError(f"a table of {num_rows} rows cannot give each of {world_size} ranks a row")
    return range(rank * num_rows // world_size, (rank + 1) * num_rows // world_size)


def shard_weights(weights: dict[str, torch.Tensor], config: V41Config, rank: int, world_size: int
                  ) -> dict[str, torch.Tensor]:
    """The checkpoint's weights as rank `rank` keeps them: its routed experts only, its rows of each Engram table.

    Everything else is shared with the input dict (no copies). Row slices are views of the full tables; the model
    moves them to its device, which copies only the slice.
    """
    mine = expert_range(config.n_routed_experts, rank, world_size)
    rows = {f"layers.{lid}.engram.embed": row_range(n, rank, world_size)
            for lid, n in zip(config.engram_layer_ids, config.engram_num_embeddings)}
    out = {}
    for name, t in weights.items():
        parts = name.split(".")
        if len(parts) > 4 and parts[2:4] == ["ffn", "experts"] and int(parts[4]) not in mine:
            continue
        table = name.rsplit(".", 1)[0]
        out[name] = t[rows[table].start: rows[table].stop] if table in rows else t
    return out


class ExpertParallelV41Model(V41Model):
    """V41Model for one rank of an EP x DP group: the same forward over this rank's own batch, with the MoE and
    Engram layers sharded over the ranks of `buffer.group` (see the module docstring).

    weights: the full checkpoint (as load_checkpoint returns it); this rank keeps its shard.
    buffer: the mini_deepep.Buffer of the group ("torch" backend on gloo/NCCL, "nvshmem" on GPUs).
    exact_moe: add the routed outputs exactly as ops.moe does (bit-identical, num_topk combines per MoE layer)
        instead of one weighted combine (two extra bf16 roundings of the routed sum).
    fold_dense_fp8: as V41Model's.
    forward is collective: every rank calls it once per step, with an empty ForwardBatch when it has no tokens.
    """

    def __init__(self, config: V41Config, weights: dict[str, torch.Tensor], buffer: Buffer,
                 device: str | torch.device = "cpu", token_map: torch.Tensor | None = None,
                 use_kernels: bool | None = None, exact_moe: bool = False, fold_dense_fp8: bool = True):
        rank, world_size = buffer.rank, buffer.num_ranks
        super().__init__(config, shard_weights(weights, config, rank, world_size), device, token_map, use_kernels,
                         fold_dense_fp8=fold_dense_fp8)
        self.buffer = buffer
        self.exact_moe = exact_moe
        self.rank, self.world_size = rank, world_size
        self.local_experts = expert_range(config.n_routed_experts, rank, world_size)
        self.engram_rows: dict[str, range] = {}
        self.engram_dense: dict[str, dict[str, torch.Tensor]] = {}
        for lid, n in zip(config.engram_layer_ids, config.engram_num_embeddings):
            p = f"layers.{lid}.engram"
            self.engram_rows[p] = row_range(n, rank, world_size)
            # the layer's replicated weights; engram_inject gets them plus the step's gathered table rows
            self.engram_dense[p] = {k: v for k, v in self.w.items() if k.startswith(f"{p}.") and ".embed." not in k}

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, cache: V41Cache) -> torch.Tensor:
        """fp32 logits [len(batch.sample_rows), vocab]; an empty batch joins the collectives and returns [0, vocab]."""
        if batch.num_tokens == 0:
            return self.idle_forward()
        return super().forward(batch, cache)

    def idle_forward(self) -> torch.Tensor:
        """Join every collective of one forward with zero tokens: per block, Engram (if any) then the MoE, in the
        order V41Model.forward calls them. Attention has no collectives, so an idle rank skips it."""
        hidden = self.config.hidden_size
        for role in self.roles:
            p = f"layers.{role.layer_id}"
            if role.has_engram:
                self.gather_table_rows(torch.empty(0, dtype=torch.int64, device=self.device), f"{p}.engram")
            self._moe(torch.empty(0, hidden, dtype=torch.bfloat16, device=self.device), f"{p}.ffn")
        return torch.empty(0, self.config.vocab_size, device=self.device)

    # ------------------------------------------------------------------ MoE over the EP group
    def _moe(self, v: torch.Tensor, p: str) -> torch.Tensor:
        cfg = self.config
        topk_idx, topk_weights = ops.moe_route(v, self.w, p, cfg)
        # tokens travel quantized (half the bytes of bf16); per-row quantization commutes with the dispatch's row
        # moves, so the experts see exactly the FP8 rows the single-process grouped MoE gathers (folded per 128 the
        # same way: fp32 [n, hidden / 128], the bytes of UE8M0 per 32)
        send = per_token_group_quant_fp8(v.contiguous(), moe.QUANT_BLOCK, "ue8m0",
                                         fold_128=moe.folds_activations(self.w, f"{p}.experts.w13"))
        recv = self.buffer.dispatch(send, topk_idx, topk_weights, cfg.n_routed_experts,
                                    m_alignment=get_m_alignment_for_contiguous_layout())
        # received rows are one 128-aligned segment per local expert (grouped_layout: local expert, -1 padding);
        # the routing weight scales h before w2, as in ops.moe, so combine must not weight again
        y = moe.grouped_expert_ffn(recv.recv_x, recv.recv_topk_weights, self.w, p, cfg, recv.grouped_layout)
        if self.exact_moe:
            routed = self._combine_in_expert_order(y, recv.handle, topk_idx)
        else:
            routed = self.buffer.combine(y, recv.handle, torch.ones_like(recv.recv_topk_weights)).float()
        if v.shape[0] == 0:
            return routed.to(torch.bfloat16)
        shared = moe.shared_expert(v, self.w, p, cfg)
        return (routed + shared.float()).to(torch.bfloat16)

    def _combine_in_expert_order(self, y: torch.Tensor, handle: DispatchHandle, topk_idx: torch.Tensor
                                 ) -> torch.Tensor:
        """fp32 [T, hidden]: each token's routed outputs added in ascending expert id, as ops.moe adds them.

        Combine with weight 1 on the rows of one top-k slot and 0 elsewhere returns that slot's output unchanged
        (one nonzero term per partial and per sum), so num_topk combines bring every output home exactly."""
        _, _, slot_of_row = handle.row_sources()
        per_slot = [self.buffer.combine(y, handle, (slot_of_row == k).float()) for k in range(topk_idx.shape[1])]
        per_slot = torch.stack(per_slot, 1)  # bf16 [T, num_topk, hidden]
        order = topk_idx.argsort(dim=1)  # the token's slots by expert id
        routed = torch.zeros(per_slot.shape[0], per_slot.shape[2], dtype=torch.float32, device=y.device)
        for j in range(order.shape[1]):
            routed += per_slot[torch.arange(order.shape[0], device=y.device), order[:, j]].float()
        return routed

    # ------------------------------------------------------------------ Engram over the row-sharded table
    def _engram_inject(self, H: torch.Tensor, row_ids: torch.Tensor, p: str) -> torch.Tensor:
        table, scale = self.gather_table_rows(row_ids.flatten(), p)
        w = type(self.w)(self.engram_dense[p])
        w[f"{p}.embed.weight"], w[f"{p}.embed.scale"] = table, scale
        own_rows = torch.arange(row_ids.numel(), device=row_ids.device).view_as(row_ids)
        return ops.engram_inject(H, own_rows, w, p, self.config)

    def gather_table_rows(self, row_ids: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The Engram table rows `row_ids` (int64 [n], global row numbers, n may differ per rank and be 0), exact:
        (e4m3 [n, head_dim], UE8M0 scales [n, head_dim / 32]). Collective over the group; one host read (the
        largest count, which sizes the all-gather)."""
        table, scale = self.w[f"{p}.embed.weight"], self.w[f"{p}.embed.scale"]
        rows = self.engram_rows[p]
        group = self.buffer.group
        # all_gather_into_tensor needs equal sizes: pad every rank's ids to the largest count with -1
        count = torch.tensor([row_ids.numel()], device=self.device)
        dist.all_reduce(count, dist.ReduceOp.MAX, group=group)
        n_max = int(count.item())
        padded = torch.full((n_max,), -1, dtype=torch.int64, device=self.device)
        padded[: row_ids.numel()] = row_ids
        every = padded.new_empty(self.world_size * n_max)
        dist.all_gather_into_tensor(every, padded, group=group)
        owned = (every >= rows.start) & (every < rows.stop)
        local = (every - rows.start).clamp(0, len(rows) - 1)
        # rows move as bytes: e4m3 row then UE8M0 scales (indexing is not implemented for every FP8 dtype)
        row_bytes = torch.cat([table.view(torch.uint8)[local], scale.view(torch.uint8)[local]], 1)
        filled = torch.where(owned[:, None], row_bytes, torch.zeros((), dtype=torch.uint8, device=self.device))
        mine = filled.new_empty(n_max, row_bytes.shape[1])
        dist.reduce_scatter_tensor(mine, filled, group=group)  # one owner per row: the byte sum is that row
        mine = mine[: row_ids.numel()]
        width = table.shape[1]
        return mine[:, :width].contiguous().view(table.dtype), mine[:, width:].contiguous().view(scale.dtype)
