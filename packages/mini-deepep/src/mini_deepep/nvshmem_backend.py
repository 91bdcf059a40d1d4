"""Intranode dispatch/combine over NVSHMEM symmetric memory and NVLink, with Triton kernels.

Stream semantics: everything is enqueued on the caller's current CUDA stream, in this order, with
no host synchronisation in the data path (the only host read is the output row count, and only when
`num_max_recv_rows` is None):

    dispatch: dispatch_notify (1 program: stores this rank's counts into every rank, raises NOTIFY
              there, waits for every rank's, plans the expert segments)
              -> [host reads the row count unless fixed]
              -> dispatch_kernel (senders: each chunk of tokens into every peer's slots, then that
              chunk's flag; receivers: the entries no token uses, own tokens from x, then the peers'
              chunks as their flags rise, into the grouped layout; then DISPATCH_CONSUMED on every peer)
    combine:  combine_kernel (senders: the peers' tokens' weighted partials into their home rank,
              slot groups taken from a work queue in slot order, a flag per group; reducers: own
              tokens' partials from y into `out`, then, as the peers' slot groups arrive, the sum of
              all partials in rank order; then COMBINE_CONSUMED on every peer)
The layout (get_dispatch_layout) is computed before, once per routing.

Each sender first waits for the previous call's CONSUMED counters, so the buffer is reused safely
however far one rank runs ahead. A wait gives up only after `wait_timeout_s` of wall-clock time,
and then flags ERROR on every rank (`Buffer.timed_out`): the data it guarded is stale. Overlap with
compute is up to the caller: run dispatch or combine on a side stream (the data kernels use `num_sms`
SMs, dispatch with one program per SM and combine with `combine_programs_per_sm`; the rest of the GPU stays
free).
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
from mini_deepep.kernels.combine import combine_kernel
from mini_deepep.kernels.dispatch import dispatch_kernel, dispatch_notify_kernel
from mini_deepep.layout import DispatchLayout


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D payload viewed as int32 words (rows must be a multiple of 4 bytes)."""
    t = t.contiguous().view(torch.uint8)
    if t.shape[1] % 4:
        raise ValueError("payload rows must be a multiple of 4 bytes (hidden % 128 == 0)")
    return t.view(torch.int32)


@dataclass
class _Notified:
    """What dispatch_notify hands to dispatch_data: the call's shapes and the segment plan."""

    parts: list[torch.Tensor]  # the payload as int32 words
    dtypes: list[torch.dtype]  # the payload's own dtypes
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    layout: DispatchLayout
    a_words: int
    b_words: int
    slots: int
    meta_offset: int
    experts_per_rank: int
    segment_base: torch.Tensor  # int32 [R, E_l]
    recv_tokens: torch.Tensor  # int32 [R], tokens each source sends here
    source_tokens: torch.Tensor  # int32 [R], each source's tokens in this call
    tokens_per_expert: torch.Tensor  # int32 [E_l]
    total_rows: torch.Tensor  # int32 [1]
    m_alignment: int
    epoch: int


def split_programs(num_programs: int, sender_share: float) -> tuple[int, int]:
    """(senders, grid) of a data kernel with `num_programs` programs: at least one of each role."""
    grid = max(2, num_programs)
    senders = min(grid - 1, max(1, round(grid * sender_share)))
    return senders, grid


def _row_blocks(a_words: int, b_words: int) -> dict[str, int]:
    """The two power-of-two pieces of a payload row (dispatch.load_rows) and the block of its scales part."""
    head = 1 << (a_words.bit_length() - 1)
    return {"ROW_HEAD": head, "ROW_TAIL": triton.next_power_of_2(max(a_words - head, 1)),
            "B_BLOCK": max(16, triton.next_power_of_2(max(b_words, 1)))}


def register_budget(num_warps: int, programs_per_sm: int) -> int:
    """Registers per thread that let `programs_per_sm` programs of `num_warps` warps share an SM (65,536 registers,
    allocated 8 at a time; at most 255), given to ptxas as maxnreg. Without it, ptxas aims lower and spends the
    difference on serialising loads: the combine kernel came out at 107 registers with only 6 of a column block's
    12 row loads in flight, and ran ~10 us slower per call (docs/reports/deepep-v6-combine-queue.md)."""
    return min(255, 65536 // (32 * num_warps * programs_per_sm) // 8 * 8)


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
        # Programs of each data kernel (senders + receivers): one per SM by default, so all are resident.
        self.num_sms = num_sms or torch.cuda.get_device_properties(self.device).multi_processor_count
        # Share of those programs that send (the rest expand or reduce); see docs/reports/deepep-dispatch-combine.md.
        self.dispatch_sender_share = 0.25
        self.combine_sender_share = 0.5
        # Whole rows each dispatch program moves at once (a power of two dividing L.CHUNK).
        self.dispatch_tile = 8
        # Dispatch with a fixed row count runs the notify inside the data kernel (its first receiver, while the
        # senders move rows) instead of a kernel before it: opt-in until measured on 2 GPUs (the notify kernel and
        # its launch are ~10 us between data kernels, docs/reports/deepep-v7-combine-fused.md).
        self.fuse_notify = False
        # Tokens, and row columns, each combine program works on at once.
        self.combine_tile, self.combine_cols = 8, 512
        # Combine reducers' tiles reduced in two passes, per reducer, counted from the last token (v7: 1 = each
        # reducer's last tile, 0 = every tile in one pass); None = every tile in two passes, the v6 kernel measured on
        # 2 GPUs. v7 is opt-in until it is measured there (docs/reports/deepep-v7-combine-fused.md).
        self.combine_two_pass_tiles: int | None = None
        # Warps per program of the two data kernels (fewer warps, fewer registers: more programs fit on an SM).
        self.dispatch_warps = self.combine_warps = 8
        # Combine programs per SM: its reducers wait on one column block's loads at a time, so a second
        # program per SM hides that latency (1.2x, docs/reports/deepep-v5-balance.md); dispatch gains nothing.
        self.combine_programs_per_sm = 2
        # trace = True: each data kernel records its programs' phase times (%globaltimer ns) in `last_trace`,
        # int64 [grid, 4] (start, phase 1 done, phase 2 done, end; phases in the kernels' docstrings).
        self.trace = False
        self.last_trace: torch.Tensor | None = None
        # How long a wait spins on a peer's counter before it gives up and sets ERROR (kernels/signals.py).
        self.timeout_ns = int(wait_timeout_s * 1e9)
        # Running targets of the CONSUMED counters (each bumped once per receiving program of a call),
        # and the epochs (1-based call numbers) that the notify and chunk flags carry.
        self._dispatch_consumed = self._combine_consumed = 0
        self._dispatch_epoch = self._combine_epoch = 0
        self._last_notify_fused = False  # the last dispatch ran its notify in its data kernel

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
        fused = num_max_recv_rows is not None and self.fuse_notify  # no host read of the row count: no notify kernel
        notified = self.dispatch_notify(parts, topk_idx, topk_weights, layout, num_experts, m_alignment,
                                        launch=not fused)
        return self.dispatch_data(notified, num_max_recv_rows, fused_notify=fused)

    def dispatch_notify(
        self,
        parts: list[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        layout: DispatchLayout,
        num_experts: int,
        m_alignment: int,
        launch: bool = True,
    ) -> _Notified:
        """First part of dispatch: exchange the counts with every rank and plan the expert segments (launch false:
        only allocate the plan, which the data kernel then fills itself: dispatch_data's fused_notify)."""
        R = self.num_ranks
        num_tokens, num_topk = topk_idx.shape
        experts_per_rank = num_experts // R
        if experts_per_rank > L.MAX_LOCAL_EXPERTS:
            raise ValueError(f"at most {L.MAX_LOCAL_EXPERTS} experts per rank")
        if num_tokens > L.CHUNK * L.MAX_CHUNKS:
            raise ValueError(f"{num_tokens} tokens exceed the {L.CHUNK * L.MAX_CHUNKS} per call that the chunk flags cover")
        words = [_words(p) for p in parts]
        a_words = words[0].shape[1]
        b_words = words[1].shape[1] if len(words) == 2 else 0
        # Slots per source: what fits both areas (combine sends bf16 rows of the same hidden back).
        slots = min(self.layout.dispatch_slots(a_words + b_words, num_topk), self.layout.combine_slots(parts[0].shape[1]))
        if num_tokens > slots:
            raise ValueError(f"{num_tokens} tokens exceed the buffer's {slots} slots per rank (see get_nvl_buffer_size_hint)")
        self._dispatch_epoch += 1
        dev = self.device
        notified = _Notified(
            parts=words, dtypes=[p.dtype for p in parts], topk_idx=topk_idx.long().contiguous(), topk_weights=topk_weights.contiguous(), layout=layout,
            a_words=a_words, b_words=b_words, slots=slots,
            meta_offset=self.layout.dispatch_meta_offset(a_words + b_words, slots), experts_per_rank=experts_per_rank,
            segment_base=torch.empty(R, experts_per_rank, dtype=torch.int32, device=dev),
            recv_tokens=torch.empty(R, dtype=torch.int32, device=dev),
            source_tokens=torch.empty(R, dtype=torch.int32, device=dev),
            tokens_per_expert=torch.empty(experts_per_rank, dtype=torch.int32, device=dev),
            total_rows=torch.empty(1, dtype=torch.int32, device=dev),
            m_alignment=m_alignment,
            epoch=self._dispatch_epoch,
        )
        if not launch:
            return notified
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        dispatch_notify_kernel[(1,)](
            self.buf32, self.buf64, self.peer_offsets, layout.num_tokens_per_rank, layout.num_tokens_per_expert,
            notified.segment_base, notified.recv_tokens, notified.source_tokens, notified.tokens_per_expert,
            notified.total_rows,
            num_tokens, self.rank, notified.epoch, self.timeout_ns, m_alignment,
            self._dispatch_consumed if self._last_notify_fused else 0,
            self.layout.expert_counts_offset, self._header(L.NOTIFY), self._header(L.DISPATCH_COUNT),
            self._header(L.SOURCE_TOKENS), self._header(L.DISPATCH_CONSUMED), self._header(L.ERROR),
            NUM_RANKS=R, EXPERTS_PER_RANK=experts_per_rank, EXPERT_BLOCK=triton.next_power_of_2(experts_per_rank),
            MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS,
            enable_fp_fusion=True,
        )
        self._last_notify_fused = False
        return notified

    def dispatch_data(self, n: _Notified, num_max_recv_rows: int | None, fused_notify: bool = False) -> DispatchResult:
        """Second part of dispatch: move the rows and expand them into the grouped layout. fused_notify (needs
        num_max_recv_rows, and dispatch_notify(..., launch=False)): the kernel runs the notify itself."""
        if fused_notify and num_max_recv_rows is None:
            raise ValueError("a fused notify needs num_max_recv_rows (the host cannot read the row count first)")
        R, slots, experts_per_rank = self.num_ranks, n.slots, n.experts_per_rank
        num_tokens, num_topk = n.topk_idx.shape
        # The one host read of the data path, skipped when the caller fixes the row count.
        num_rows = int(n.total_rows.item()) if num_max_recv_rows is None else num_max_recv_rows
        dev = self.device
        out_a = torch.empty(num_rows, n.a_words, dtype=torch.int32, device=dev)
        out_b = torch.empty(num_rows, n.b_words, dtype=torch.int32, device=dev)
        # No fills: the data kernel writes every entry (dispatch._fill_unused writes the ones no token uses).
        grouped_layout = torch.empty(num_rows, dtype=torch.int32, device=dev)
        row_weights = torch.empty(num_rows, dtype=torch.float32, device=dev)
        positions = torch.empty(R * slots, num_topk, dtype=torch.int32, device=dev)
        recv_src_rank = torch.empty(R * slots, dtype=torch.int32, device=dev)
        recv_src_token = torch.empty(R * slots, dtype=torch.int32, device=dev)
        senders, grid = self.data_grid("dispatch")
        dispatch_kernel[(grid,)](
            self.buf32, self.buf64, self.peer_offsets,
            _nonempty(n.parts[0]), _nonempty(n.parts[-1]), _nonempty(n.topk_idx), _nonempty(n.topk_weights),
            _nonempty(n.layout.send_slot), _nonempty(n.layout.rank_in_expert), n.segment_base, n.source_tokens,
            n.recv_tokens, n.tokens_per_expert, n.total_rows,
            _nonempty(out_a), _nonempty(out_b if n.b_words else out_a), _nonempty(grouped_layout),
            _nonempty(row_weights), positions, recv_src_rank, recv_src_token,
            num_tokens, num_rows, self.rank, n.epoch, self._dispatch_consumed, self.timeout_ns, slots, n.m_alignment,
            self.layout.dispatch_offset, n.meta_offset, self.layout.dispatch_flags_offset,
            self.layout.chunk_ranges_offset, self._header(L.DISPATCH_CONSUMED), self._header(L.ERROR),
            n.layout.num_tokens_per_rank, n.layout.num_tokens_per_expert, self.layout.expert_counts_offset,
            self._header(L.NOTIFY), self._header(L.DISPATCH_COUNT), self._header(L.SOURCE_TOKENS),
            self.layout.notified_offset, self._trace_buffer(grid),
            NUM_SENDERS=senders, NUM_RANKS=R, TOPK=num_topk, TOPK_BLOCK=triton.next_power_of_2(num_topk),
            EXPERTS_PER_RANK=experts_per_rank, A_WORDS=n.a_words, B_WORDS=n.b_words,
            META_WORDS=L.meta_words(num_topk), META_BLOCK=triton.next_power_of_2(L.meta_words(num_topk)),
            CHUNK=L.CHUNK, MAX_CHUNKS=L.MAX_CHUNKS, TILE=self.dispatch_tile, FUSED_NOTIFY=fused_notify,
            EXPERT_BLOCK=triton.next_power_of_2(experts_per_rank), MAX_LOCAL_EXPERTS=L.MAX_LOCAL_EXPERTS,
            TRACE=self.trace,
            **_row_blocks(n.a_words, n.b_words),
            num_warps=self.dispatch_warps,
            enable_fp_fusion=True,
        )
        self._dispatch_consumed += grid - senders
        self._last_notify_fused = fused_notify
        outs = [out.view(torch.uint8).view(dtype) for out, dtype in zip((out_a, out_b), n.dtypes)]
        handle = DispatchHandle(
            num_ranks=R,
            num_tokens=num_tokens,
            num_topk=num_topk,
            hidden=outs[0].shape[1],
            is_token_in_rank=n.layout.is_token_in_rank,
            send_slot=n.layout.send_slot,
            recv_src_rank=recv_src_rank,
            recv_src_token=recv_src_token,
            recv_tokens_per_rank=n.recv_tokens,
            positions=positions,
            recv_topk_weights=row_weights,
            grouped_layout=grouped_layout,
            num_recv_rows=n.total_rows[0],
        )
        recv_x = outs[0] if len(outs) == 1 else (outs[0], outs[1])
        return DispatchResult(recv_x, grouped_layout, row_weights, n.tokens_per_expert, handle)

    def data_grid(self, kernel: str) -> tuple[int, int]:
        """(senders, grid) of the "dispatch" or "combine" data kernel."""
        if kernel == "dispatch":
            return split_programs(self.num_sms, self.dispatch_sender_share)
        return split_programs(self.num_sms * self.combine_programs_per_sm, self.combine_sender_share)

    def _trace_buffer(self, grid: int) -> torch.Tensor:
        """Where a data kernel writes its phase times (when not tracing, any int64 tensor: never touched)."""
        if not self.trace:
            return self.peer_offsets
        # empty, not zeros: every program writes its row, and a fill would add a kernel between traced calls.
        self.last_trace = torch.empty(grid, 4, dtype=torch.int64, device=self.device)
        return self.last_trace

    def combine(self, y: torch.Tensor, handle: DispatchHandle, row_weights: torch.Tensor) -> torch.Tensor:
        R, hidden = self.num_ranks, y.shape[1]
        slots = handle.positions.shape[0] // R
        if slots > self.layout.combine_slots(hidden):
            raise ValueError("the combine area is too small for this dispatch's slots (see get_nvl_buffer_size_hint)")
        if L.GROUP % self.combine_tile:
            raise ValueError(f"combine_tile must divide the combine flag group ({L.GROUP} slots)")
        self._combine_epoch += 1
        out = torch.empty(handle.num_tokens, hidden, dtype=torch.bfloat16, device=self.device)
        senders, grid = self.data_grid("combine")
        pieces = _row_blocks(hidden, 0)  # pass 2's whole bf16 rows (2 tokens: R partials + fp32 sums in registers)
        one_pass = self.combine_two_pass_tiles is not None
        num_tiles = triton.cdiv(handle.num_tokens, self.combine_tile)
        two_pass_from = max(num_tiles - (grid - senders) * self.combine_two_pass_tiles, 0) if one_pass else 0
        combine_kernel[(grid,)](
            self.buf16, self.buf64, self.peer_offsets,
            _nonempty(y), _nonempty(row_weights), handle.positions, handle.recv_tokens_per_rank,
            _nonempty(handle.send_slot), _nonempty(out),
            handle.num_tokens, slots, self.rank, self._combine_epoch, self._combine_consumed, self.timeout_ns,
            two_pass_from, self.layout.combine_offset, self.layout.combine_flags_offset,
            self._header(L.COMBINE_CONSUMED), self._header(L.ERROR), self.layout.combine_queue_offset, self._trace_buffer(grid),
            NUM_SENDERS=senders, NUM_RANKS=R, RANK_BLOCK=triton.next_power_of_2(R), TOPK=handle.num_topk,
            TOPK_BLOCK=triton.next_power_of_2(handle.num_topk), HIDDEN=hidden, GROUP=L.GROUP, MAX_GROUPS=L.MAX_GROUPS,
            TILE=self.combine_tile, COLS=min(self.combine_cols, triton.next_power_of_2(hidden)),
            ROW_TOKENS=2, ROW_HEAD=pieces["ROW_HEAD"], ROW_TAIL=pieces["ROW_TAIL"], ONE_PASS=one_pass, TRACE=self.trace,
            num_warps=self.combine_warps, maxnreg=register_budget(self.combine_warps, self.combine_programs_per_sm),
            enable_fp_fusion=True,
        )
        self._combine_consumed += grid - senders
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
