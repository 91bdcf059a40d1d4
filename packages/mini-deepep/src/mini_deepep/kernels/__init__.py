"""Triton kernels: the NVSHMEM backend's dispatch/combine and the routing layout (imported lazily: triton is optional)."""
