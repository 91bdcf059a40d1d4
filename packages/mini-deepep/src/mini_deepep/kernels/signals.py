"""Acquire/release flags between GPUs, as Triton device functions.

A producer stores its rows into a peer's symmetric buffer, then (after a CTA barrier, so every
thread's stores come first) one release atomic at system scope bumps a counter in the peer's header;
the consumer spins on that counter with acquire loads, which makes the rows visible to it and to the
kernels it runs after. Counters only grow, so a wait is "counter >= n * programs" for call n.
"""

import triton
import triton.language as tl

# About 2^24 polls (seconds on an H200) before a wait gives up and flags ERROR instead of hanging.
MAX_SPINS = tl.constexpr(1 << 24)


@triton.jit
def wait_at_least(flag_ptr, target, error_ptr):
    """Spin until *flag_ptr >= target (acquire, system scope); on timeout set *error_ptr = 1."""
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < target) & (spins < MAX_SPINS):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        spins += 1
    if seen < target:
        tl.atomic_max(error_ptr, 1, sem="relaxed", scope="gpu")
    # Every thread of the program goes on only after the acquire (the data it guards is now visible).
    tl.debug_barrier()


@triton.jit
def release_add(flag_ptr):
    """Make this program's earlier stores visible before bumping *flag_ptr (release, system scope)."""
    tl.debug_barrier()
    tl.atomic_add(flag_ptr, 1, sem="release", scope="sys")


@triton.jit
def peer_offset(peer_offsets_ptr, peer):
    """Offset, in int32 words, from this rank's symmetric buffer to `peer`'s NVLink mapping of it."""
    # Heap mappings are at least 2 MiB aligned: telling the compiler keeps 16-byte vector stores.
    return tl.multiple_of(tl.load(peer_offsets_ptr + peer), 16)
