"""Intranode dispatch/combine over NVSHMEM symmetric memory and NVLink, with Triton kernels.

Stream semantics: everything is enqueued on the caller's current CUDA stream, in this order, with
no host synchronisation in the data path (the only host read is the output row count, and only when
`num_max_recv_rows` is None):

    dispatch: dispatch_send (stores each token's row and meta into every destination, its
              per-expert counts into their headers, release-bumps DISPATCH_ARRIVED there)
              -> dispatch_plan (1 program: acquire-waits on DISPATCH_ARRIVED, turns the count
              matrix into segment bases) -> [host reads the row count unless fixed]
              -> dispatch_expand (slots into the grouped layout, release-bumps DISPATCH_CONSUMED
              on every source)
    combine:  combine_send (per-slot weighted partials into the home rank, release-bumps
              COMBINE_ARRIVED) -> combine_reduce (acquire-waits, sums partials, release-bumps
              COMBINE_CONSUMED)
The layout (get_dispatch_layout, torch ops) is computed before, once per routing.

Each send kernel first waits for the previous call's CONSUMED counters, so the buffer is reused
safely however far one rank runs ahead. A wait gives up only after `wait_timeout_s` of wall-clock
time, and then flags ERROR on every rank (`Buffer.timed_out`): the data it guarded is stale. Overlap with compute is up to the caller: run dispatch or
combine on a side stream (the kernels take `num_sms` programs, the rest of the GPU stays free).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import triton

from mini_deepep import nvshmem_layout as L
from mini_deepep.handle import DispatchHandle, DispatchResult
from mini_deepep.kernels.combine import combine_reduce_kernel, combine_send_kernel
from mini_deepep.kernels.dispatch import dispatch_expand_kernel, dispatch_plan_kernel, dispatch_send_kernel
from mini_deepep.layout import DispatchLayout


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D payload viewed as int32 words (rows must be a multiple of 4 bytes)."""
    t = t.contiguous().view(torch.uint8)
    if t.shape[1] % 4:
        raise ValueError("payload rows must be a multiple of 4 bytes (hidden % 128 == 0)")
    return t.view(torch.int32)


@dataclass
class _SentDispatch:
    """What dispatch_send hands to dispatch_receive."""

    dtypes: list[torch.dtype]
    a_words: int
    b_words: int
    slots: int
    meta_offset: int
    num_topk: int
    experts_per_rank: int
    layout: DispatchLayout


def _row_blocks(a_words: int, b_words: int) -> dict[str, int]:
    """Power-of-two blocks holding a whole payload row (and the scales part)."""
    return {"ROW_BLOCK": triton.next_power_of_2(a_words), "B_BLOCK": max(16, triton.next_power_of_2(max(b_words, 1)))}


def _nonempty(t: torch.Tensor) -> torch.Tensor:
    """Triton rejects null pointers: give empty tensors one dummy row (never read, masked)."""
    return t if t.numel() else t.new_zeros((1, *t.shape[1:]))


class NvshmemBackend:
    def __init__(
        self, group: dist.ProcessGroup | None, num_nvl_bytes: int, num_sms: int | None, wait_timeout_s: float
    ) -> None:
        import nvshmem.core as nvshmem

        try:
            from cuda.core import Device
        except ImportError:  # older cuda-core
            from cuda.core.experimental import Device

        self.nvshmem = nvshmem
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        num_nvl_bytes = num_nvl_bytes // L.ALIGN_BYTES * L.ALIGN_BYTES
        self.layout = L.SymmetricLayout(num_nvl_bytes, self.num_ranks)
        self.device = torch.device("cuda", torch.cuda.current_device())
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(num_nvl_bytes + (64 << 20)))

        # Bootstrap: rank 0's unique id reaches the others through the torch group.
        cu_device = Device(self.device.index)
        cu_device.set_current()
        uid = nvshmem.get_unique_id(empty=self.rank != 0)
        uid_bytes = torch.from_numpy(uid._data.view(np.uint8).copy()).to(self.device)
        dist.broadcast(uid_bytes, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        uid._data[:] = uid_bytes.cpu().numpy().view(uid._data.dtype)
        nvshmem.init(device=cu_device, uid=uid, rank=self.rank, nranks=self.num_ranks, initializer_method="uid")
        self._finalized = False
        try:
            self.buffer = nvshmem.tensor((num_nvl_bytes,), dtype=torch.uint8)
            self.buffer[: L.HEADER_BYTES].zero_()
            base = self.buffer.data_ptr()
            offsets = []
            for peer in range(self.num_ranks):
                view = self.buffer if peer == self.rank else nvshmem.get_peer_tensor(self.buffer, peer)
                offsets.append((view.data_ptr() - base) // 4)
            self.peer_offsets = torch.tensor(offsets, dtype=torch.int64, device=self.device)
            torch.cuda.synchronize()
            dist.barrier(group=group)
        except BaseException:
            self.destroy()
            raise
        self.buf32 = self.buffer.view(torch.int32)
        self.buf64 = self.buffer.view(torch.int64)
        self.buf16 = self.buffer.view(torch.bfloat16)
        # Local kernels (expand, reduce) fill the GPU; only the NVLink senders are limited to num_sms.
        sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.num_sms = num_sms or sm_count
        self.local_programs = 4 * sm_count
        # How long a wait spins on a peer's counter before it gives up and sets ERROR (kernels/signals.py).
        self.timeout_ns = int(wait_timeout_s * 1e9)
        # Running targets of the header counters (each bumped once per program of the kernel that signals).
        self._dispatch_arrived = self._dispatch_consumed = self._combine_arrived = self._combine_consumed = 0

    def _header(self, which: int) -> int:
        return self.layout.signal_offset(which)

    def timed_out(self) -> bool:
        """True if a wait here or on a peer gave up (sticky). Reads the device (host sync)."""
        return bool(self.buf64[self._header(L.ERROR)].item())

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
        sent = self.dispatch_send(parts, topk_idx, topk_weights, layout, num_experts)
        return self.dispatch_receive(sent, m_alignment, num_max_recv_rows)

    def dispatch_send(
        self,
        parts: list[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: DispatchLayout,
        num_experts: int,
    ) -> _SentDispatch:
        """First half of dispatch: store this rank's tokens into every destination's slots."""
        R = self.num_ranks
        num_tokens, num_topk = topk_idx.shape
        experts_per_rank = num_experts // R
        if experts_per_rank > L.MAX_LOCAL_EXPERTS:
            raise ValueError(f"at most {L.MAX_LOCAL_EXPERTS} experts per rank")
        words = [_words(p) for p in parts]
        a_words = words[0].shape[1]
        b_words = words[1].shape[1] if len(words) == 2 else 0
        # Slots per source: what fits both areas (combine sends bf16 rows of the same hidden back).
        slots = min(self.layout.dispatch_slots(a_words + b_words, num_topk), self.layout.combine_slots(parts[0].shape[1]))
        if num_tokens > slots:
            raise ValueError(f"{num_tokens} tokens exceed the buffer's {slots} slots per rank (see get_nvl_buffer_size_hint)")
        sent = _SentDispatch(
            dtypes=[p.dtype for p in parts], a_words=a_words, b_words=b_words, slots=slots,
            meta_offset=self.layout.dispatch_meta_offset(a_words + b_words, slots), num_topk=num_topk,
            experts_per_rank=experts_per_rank, layout=layout,
        )
        dispatch_send_kernel[(self.num_sms,)](
            self.buf32, self.buf64, self.peer_offsets,
            _nonempty(words[0]), _nonempty(words[-1]),
            _nonempty(topk_idx.long().contiguous()), _nonempty(topk_weights.contiguous()),
            _nonempty(layout.send_slot), _nonempty(layout.rank_in_expert),
            layout.num_tokens_per_rank, layout.num_tokens_per_expert,
            num_tokens, self.rank, self._dispatch_consumed, self.timeout_ns,
            self.layout.dispatch_offset, sent.meta_offset, slots, self.layout.expert_counts_offset,
            self._header(L.DISPATCH_ARRIVED), self._header(L.DISPATCH_CONSUMED),
            self._header(L.DISPATCH_COUNT), self._header(L.ERROR),
            NUM_RANKS=R, TOPK=num_topk, EXPERTS_PER_RANK=experts_per_rank,
            EXPERT_BLOCK=triton.next_power_of_2(experts_per_rank), MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS,
            A_WORDS=a_words, B_WORDS=b_words, META_WORDS=L.meta_words(num_topk),
            META_BLOCK=triton.next_power_of_2(L.meta_words(num_topk)), **_row_blocks(a_words, b_words),
            num_warps=8,
        )
        self._dispatch_arrived += self.num_sms
        return sent

    def dispatch_receive(self, sent: _SentDispatch, m_alignment: int, num_max_recv_rows: int | None) -> DispatchResult:
        """Second half of dispatch: wait for every source, plan the expert segments, expand into them."""
        R, slots, num_topk, experts_per_rank = self.num_ranks, sent.slots, sent.num_topk, sent.experts_per_rank
        segment_base = torch.empty(R, experts_per_rank, dtype=torch.int32, device=self.device)
        tokens_per_expert = torch.empty(experts_per_rank, dtype=torch.int32, device=self.device)
        total_rows = torch.empty(1, dtype=torch.int32, device=self.device)
        dispatch_plan_kernel[(1,)](
            self.buf32, self.buf64, self.peer_offsets, segment_base, tokens_per_expert, total_rows,
            self._dispatch_arrived, self.timeout_ns, self.layout.expert_counts_offset, self._header(L.DISPATCH_ARRIVED),
            self._header(L.ERROR), m_alignment,
            NUM_RANKS=R, EXPERTS_PER_RANK=experts_per_rank, EXPERT_BLOCK=triton.next_power_of_2(experts_per_rank),
            MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS,
        )
        # The one host read of the data path, skipped when the caller fixes the row count.
        num_rows = int(total_rows.item()) if num_max_recv_rows is None else num_max_recv_rows

        out_a = torch.empty(num_rows, sent.a_words, dtype=torch.int32, device=self.device)
        out_b = torch.empty(num_rows, sent.b_words, dtype=torch.int32, device=self.device)
        grouped_layout = torch.full((num_rows,), -1, dtype=torch.int32, device=self.device)
        row_weights = torch.zeros(num_rows, dtype=torch.float32, device=self.device)
        positions = torch.empty(R * slots, num_topk, dtype=torch.int32, device=self.device)
        recv_src_rank = torch.empty(R * slots, dtype=torch.int32, device=self.device)
        recv_src_token = torch.empty(R * slots, dtype=torch.int32, device=self.device)
        dispatch_expand_kernel[(self.local_programs,)](
            self.buf32, self.buf64, self.peer_offsets, segment_base,
            _nonempty(out_a), _nonempty(out_b if sent.b_words else out_a), _nonempty(grouped_layout),
            _nonempty(row_weights), positions, recv_src_rank, recv_src_token,
            num_rows, slots, self.rank, self.layout.dispatch_offset, sent.meta_offset,
            self._header(L.DISPATCH_COUNT), self._header(L.DISPATCH_CONSUMED),
            NUM_RANKS=R, TOPK=num_topk, TOPK_BLOCK=triton.next_power_of_2(num_topk),
            EXPERTS_PER_RANK=experts_per_rank, A_WORDS=sent.a_words, B_WORDS=sent.b_words,
            META_WORDS=L.meta_words(num_topk), **_row_blocks(sent.a_words, sent.b_words),
            num_warps=8,
        )
        self._dispatch_consumed += self.local_programs
        outs = [out.view(torch.uint8).view(dtype) for out, dtype in zip((out_a, out_b), sent.dtypes)]
        handle = DispatchHandle(
            num_ranks=R,
            num_tokens=sent.layout.is_token_in_rank.shape[0],
            num_topk=num_topk,
            hidden=outs[0].shape[1],
            is_token_in_rank=sent.layout.is_token_in_rank,
            send_slot=sent.layout.send_slot,
            recv_src_rank=recv_src_rank,
            recv_src_token=recv_src_token,
            positions=positions,
            recv_topk_weights=row_weights,
            grouped_layout=grouped_layout,
            num_recv_rows=total_rows[0],
        )
        recv_x = outs[0] if len(outs) == 1 else (outs[0], outs[1])
        return DispatchResult(recv_x, grouped_layout, row_weights, tokens_per_expert, handle)

    def combine(self, y: torch.Tensor, handle: DispatchHandle, row_weights: torch.Tensor) -> torch.Tensor:
        self.combine_send(y, handle, row_weights)
        return self.combine_receive(handle, y.shape[1])

    def combine_send(self, y: torch.Tensor, handle: DispatchHandle, row_weights: torch.Tensor) -> None:
        """First half of combine: store each received token's weighted partial into its home rank."""
        R, hidden = self.num_ranks, y.shape[1]
        slots = handle.positions.shape[0] // R
        if slots > self.layout.combine_slots(hidden):
            raise ValueError("the combine area is too small for this dispatch's slots (see get_nvl_buffer_size_hint)")
        combine_send_kernel[(self.num_sms,)](
            self.buf16, self.buf64, self.peer_offsets,
            _nonempty(y), _nonempty(row_weights), handle.positions, handle.recv_src_rank,
            R * slots, slots, self.rank, self._combine_consumed, self.timeout_ns,
            self.layout.combine_offset, self._header(L.COMBINE_CONSUMED), self._header(L.COMBINE_ARRIVED),
            self._header(L.ERROR),
            NUM_RANKS=R, TOPK=handle.num_topk, HIDDEN=hidden, ROW_BLOCK=triton.next_power_of_2(hidden), num_warps=8,
        )
        self._combine_arrived += self.num_sms

    def combine_receive(self, handle: DispatchHandle, hidden: int) -> torch.Tensor:
        """Second half of combine: wait for every expert rank and add the partials per token."""
        R = self.num_ranks
        slots = handle.positions.shape[0] // R
        out = torch.empty(handle.num_tokens, hidden, dtype=torch.bfloat16, device=self.device)
        combine_reduce_kernel[(self.local_programs,)](
            self.buf16, self.buf64, self.peer_offsets,
            _nonempty(handle.send_slot), _nonempty(out),
            handle.num_tokens, slots, self.rank, self._combine_arrived, self.timeout_ns,
            self.layout.combine_offset, self._header(L.COMBINE_ARRIVED), self._header(L.COMBINE_CONSUMED),
            self._header(L.ERROR),
            NUM_RANKS=R, HIDDEN=hidden, ROW_BLOCK=triton.next_power_of_2(hidden), num_warps=8,
        )
        self._combine_consumed += self.local_programs
        return out

    def destroy(self) -> None:
        """Free the symmetric buffer and finalise NVSHMEM (idempotent; collective)."""
        if self._finalized:
            return
        self._finalized = True
        torch.cuda.synchronize()
        if getattr(self, "buffer", None) is not None:
            self.buf16 = self.buf32 = self.buf64 = None
            self.nvshmem.free_tensor(self.buffer)
            self.buffer = None
        self.nvshmem.finalize()
