"""Triton kernels of the NVSHMEM backend (imported lazily: triton is optional)."""
