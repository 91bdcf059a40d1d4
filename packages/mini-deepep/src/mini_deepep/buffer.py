"""`Buffer`: the one public entry point, with an NVSHMEM backend and a torch.distributed one."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mini_deepep.handle import DispatchHandle, DispatchResult, Payload, payload_parts
from mini_deepep.layout import DispatchLayout, get_dispatch_layout
from mini_deepep.torch_backend import TorchBackend


def nvshmem_available() -> bool:
    """True when this process can run the NVSHMEM backend (CUDA, triton and nvshmem4py importable)."""
    if not torch.cuda.is_available():
        return False
    try:
        import nvshmem.core  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class Buffer:
    """Expert-parallel dispatch/combine over the ranks of `group` (one GPU or CPU process per rank).

    group: the torch.distributed group whose ranks hold the experts (None = WORLD). Experts are
        split in contiguous blocks: rank r owns experts [r * E / R, (r + 1) * E / R).
    num_nvl_bytes: size of the symmetric NVSHMEM buffer per rank (NVSHMEM backend only); see
        `get_nvl_buffer_size_hint`. Must be equal on all ranks.
    backend: "nvshmem" (intranode, Triton kernels storing into peers' symmetric memory, no host
        sync in the data path), "torch" (all_to_all_single; gloo or NCCL) or "auto" (nvshmem when
        available on CUDA, else torch).
    num_sms: programs of each NVSHMEM data kernel (its SM footprint: senders and receivers together);
        None = one per SM (best when nothing runs alongside; lower it to overlap dispatch/combine with
        compute).
    wait_timeout_s: wall-clock seconds an NVSHMEM kernel waits for a peer before giving up (see
        `timed_out`). Generous on purpose: on a loaded host a healthy peer can lag by seconds.

    Every method is collective: all ranks call the same methods in the same order. Call `destroy()`
    (or use the Buffer as a context manager) before the process group goes away; NVSHMEM can be
    initialised once per process, so keep one Buffer per process.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        num_nvl_bytes: int = 0,
        *,
        backend: str = "auto",
        num_sms: int | None = None,
        wait_timeout_s: float = 100.0,
    ) -> None:
        if backend == "auto":
            backend = "nvshmem" if nvshmem_available() and num_nvl_bytes > 0 else "torch"
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        self.backend_name = backend
        self.wait_timeout_s = wait_timeout_s
        if backend == "torch":
            self._backend = TorchBackend(group)
        elif backend == "nvshmem":
            from mini_deepep.nvshmem_backend import NvshmemBackend

            self._backend = NvshmemBackend(group, num_nvl_bytes, num_sms, wait_timeout_s)
        else:
            raise ValueError(f"unknown backend {backend!r} (expected 'auto', 'nvshmem' or 'torch')")

    @staticmethod
    def get_nvl_buffer_size_hint(max_tokens_per_rank: int, hidden: int, num_topk: int, num_ranks: int) -> int:
        """Symmetric bytes per rank for up to `max_tokens_per_rank` bf16 tokens of `hidden` (FP8 needs less)."""
        from mini_deepep.nvshmem_layout import SymmetricLayout

        return SymmetricLayout.bytes_needed(max_tokens_per_rank, hidden, num_topk, num_ranks)

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int) -> DispatchLayout:
        """(num_tokens_per_rank int32 [R], num_tokens_per_expert int32 [E], is_token_in_rank bool [T, R]).

        topk_idx: int [num_tokens, num_topk] global expert ids, -1 = none. No host sync.
        """
        return get_dispatch_layout(topk_idx, num_experts, self.num_ranks)

    def dispatch(
        self,
        x: Payload,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        num_experts: int,
        *,
        layout: DispatchLayout | None = None,
        m_alignment: int = 128,
        num_max_recv_rows: int | None = None,
    ) -> DispatchResult:
        """Send every token to the ranks that hold its experts, grouped by local expert on arrival.

        x: bf16 [num_tokens, hidden], or (e4m3 [num_tokens, hidden], float8_e8m0fnu
            [num_tokens, hidden / 32]) as mini_deepgemm.reference.act_quant(x, 32) returns, or with float32
            scales [num_tokens, hidden / 128] (mini-deepgemm's per_token_group_quant_fp8(..., fold_128=True); the
            same bytes per row). Scales travel as bytes, unread.
            num_tokens may differ between ranks and may be 0.
        topk_idx: int64 [num_tokens, num_topk] global expert ids, -1 = no expert.
        topk_weights: float32 [num_tokens, num_topk].
        layout: this call's `get_dispatch_layout` result, if already computed.
        m_alignment: each local expert's rows start at a multiple of it (mini-deepgemm's contiguous
            grouped GEMM needs get_mk_alignment_for_contiguous_layout(), 128 on SM90).
        num_max_recv_rows: fixed number of output rows (no host sync; pairs beyond it are dropped,
            check handle.num_recv_rows), or None for exactly the rows needed (one host read).

        Returns DispatchResult(recv_x, grouped_layout, recv_topk_weights, num_recv_tokens_per_expert,
        handle): recv_x [M, hidden] (a tuple with the scales in the form sent, for FP8) holds one row per
        (token, k) pair routed here, sorted by local expert, then source rank, then source token;
        grouped_layout int32 [M] is the local expert id per row (-1 for padding rows, whose data is
        unspecified); recv_topk_weights float32 [M] the pair's weight (0 for padding);
        num_recv_tokens_per_expert int32 [E / R] the valid rows per local expert.
        """
        parts = payload_parts(x)
        if topk_idx.shape[0] != parts[0].shape[0] or topk_weights.shape != topk_idx.shape:
            raise ValueError("x, topk_idx and topk_weights must have the same number of tokens (and topk shapes match)")
        if layout is None:
            layout = self.get_dispatch_layout(topk_idx, num_experts)
        return self._backend.dispatch(
            parts, topk_idx, topk_weights.float(), layout, num_experts, m_alignment, num_max_recv_rows
        )

    def combine(self, y: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """Weighted sum of the expert outputs, back on each token's rank in its original order.

        y: bf16 [M, hidden], expert outputs in the layout dispatch returned (padding rows ignored).
        topk_weights: float32 [M], the weight of each row; None = the dispatched weights
            (handle.recv_topk_weights).
        Returns bf16 [num_tokens, hidden]: out[t] = sum_k w[t, k] * y(t, k), accumulated in fp32
        (each expert rank sums its own k first and sends that partial as bf16; the source adds the
        partials in rank order). Tokens routed to no expert get zeros.
        """
        if y.dtype != torch.bfloat16 or y.dim() != 2 or y.shape[0] != handle.grouped_layout.numel():
            raise ValueError(f"y must be bf16 [{handle.grouped_layout.numel()}, hidden], got {y.dtype} {tuple(y.shape)}")
        weights = handle.recv_topk_weights if topk_weights is None else topk_weights.float()
        return self._backend.combine(y.contiguous(), handle, weights.contiguous())

    def set_num_sms(self, num_sms: int) -> None:
        """SMs the NVSHMEM data kernels use (dispatch runs one program per SM, combine combine_programs_per_sm).
        Collective: same value on all ranks."""
        if hasattr(self._backend, "num_sms"):
            self._backend.num_sms = num_sms

    def timed_out(self) -> bool:
        """True if an NVSHMEM wait gave up on a peer (a would-be hang); always False for torch. Host sync.

        A wait that gives up lets its kernel go on with stale data: once this is True, the results
        of the call that timed out and of every later call are wrong. It is sticky and set on every
        rank (later waits give up at once, so a lost peer cannot hang each kernel in turn); the
        Buffer is unusable, destroy it. Check it before trusting results where a peer may stall.
        """
        return bool(getattr(self._backend, "timed_out", lambda: False)())

    def destroy(self) -> None:
        """Free the symmetric memory and finalise NVSHMEM (a no-op for the torch backend). Collective."""
        destroy = getattr(self._backend, "destroy", None)
        if destroy is not None:
            destroy()

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
