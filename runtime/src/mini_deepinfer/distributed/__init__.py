"""Multi-process pieces of the runtime: EP x DP checks and launchers (the sharded model is models/*/parallel.py)."""

import os

import torch
import torch.distributed as dist


def init_torchrun_process_group(device_type: str) -> torch.device:
    """Join the torchrun job: NCCL with one GPU per rank (LOCAL_RANK) on CUDA, gloo on CPU. Returns the device."""
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")
