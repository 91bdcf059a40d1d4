"""mini-deepep: MoE dispatch/combine across GPUs (NVSHMEM symmetric memory, or torch.distributed)."""

from mini_deepep.buffer import Buffer
from mini_deepep.handle import DispatchHandle, DispatchResult
from mini_deepep.layout import DispatchLayout, get_dispatch_layout

__all__ = ["Buffer", "DispatchHandle", "DispatchLayout", "DispatchResult", "get_dispatch_layout"]
