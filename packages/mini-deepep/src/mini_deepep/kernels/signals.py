"""Acquire/release flags between GPUs, as Triton device functions.

A producer stores its rows into a peer's symmetric buffer, then (after a CTA barrier, so every
thread's stores come first) one release atomic at system scope bumps a counter in the peer's header;
the consumer spins on that counter with acquire loads, which makes the rows visible to it and to the
kernels it runs after. Counters only grow, so a wait is "counter >= n * programs" for call n; per-chunk flags hold the
epoch (1-based call number) of the last call that filled the chunk, so a wait is "flag >= epoch".

A wait that gives up lets its kernel go on with stale data, so giving up must be rare and loud:
- the limit is wall-clock time (%globaltimer), not a poll count: one poll's cost varies (the former
  2^24-poll limit was only seconds), while a healthy peer can legitimately lag for seconds on a
  loaded host (CPU-starved process, Triton JIT compile, a GPU time-sliced with other processes);
- giving up sets the ERROR word of every rank, so every rank's `Buffer.timed_out()` says so;
- ERROR is sticky: once set (here or by a peer), later waits give up at once, so a lost peer ends
  the run within one timeout instead of one timeout per program wave of every later kernel.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

# Polls between two reads of the clock and of the ERROR word (keeps the spin loop lean).
POLLS_PER_CHECK = tl.constexpr(256)


@triton.jit
def peer_offset(peer_offsets_ptr, peer):
    """Offset, in int32 words, from this rank's symmetric buffer to `peer`'s NVLink mapping of it."""
    # Heap mappings are at least 2 MiB aligned: telling the compiler keeps 16-byte vector stores.
    return tl.multiple_of(tl.load(peer_offsets_ptr + peer), 16)


@triton.jit
def wait_at_least(flag_ptr, target, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS: tl.constexpr):
    """Spin until *flag_ptr >= target (acquire, system scope).

    Gives up when this rank's ERROR word (buf64[error_offset]) is set: by this wait after
    `timeout_ns` of wall-clock time, then also on every peer, or earlier by any wait here or on a peer.
    """
    # Scalar atomics run on thread 0 and broadcast their result through shared memory, so `seen` and
    # `error` are the same in every thread and the whole program leaves the loop together. The clock
    # is per thread: only thread 0's reading reaches the atomic_max, whose (broadcast) old value
    # ends the loop one check later.
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if seen < target:
        error_ptr = buf64 + error_offset
        start = globaltimer()
        error = tl.atomic_add(error_ptr, 0, sem="relaxed", scope="sys")
        polls = 0
        while (seen < target) & (error == 0):
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
            polls += 1
            if polls % POLLS_PER_CHECK == 0:
                late = (globaltimer() - start > timeout_ns).to(tl.int64)
                error = tl.atomic_max(error_ptr, late, sem="relaxed", scope="sys")
        if seen < target:
            for d in tl.static_range(NUM_RANKS):
                tl.atomic_max(buf64 + (peer_offset(peer_offsets, d) >> 1) + error_offset, 1, sem="relaxed", scope="sys")
    # Every thread of the program goes on only after the acquire (the data it guards is now visible).
    tl.debug_barrier()


@triton.jit
def release_add(flag_ptr):
    """Make this program's earlier stores visible before bumping *flag_ptr (release, system scope)."""
    tl.debug_barrier()
    tl.atomic_add(flag_ptr, 1, sem="release", scope="sys")


@triton.jit
def release_epoch(flag_ptr, epoch):
    """Make this program's earlier stores visible before raising *flag_ptr to `epoch` (release, system scope).

    A flag that holds the call's epoch (instead of counting programs) stays right when a call uses
    fewer chunks than an earlier one: an unused flag just keeps an older epoch."""
    tl.debug_barrier()
    tl.atomic_max(flag_ptr, epoch, sem="release", scope="sys")


@triton.jit
def wait_for_peers(counters_offset, target, rank, buf64, peer_offsets, error_offset, timeout_ns, NUM_RANKS: tl.constexpr):
    """Wait until this rank's counter of every peer (buf64[counters_offset + peer], peer != rank) reaches `target`.
    One rank has no peer: nothing to wait for, and no code (rank is a run-time value, NUM_RANKS is not)."""
    if NUM_RANKS > 1:
        for d in tl.static_range(NUM_RANKS):
            if d != rank:
                wait_at_least(buf64 + counters_offset + d, target, buf64, peer_offsets, error_offset, timeout_ns,
                              NUM_RANKS)


@triton.jit
def release_add_on_peers(buf64, peer_offsets, counters_offset, rank, NUM_RANKS: tl.constexpr):
    """Bump this rank's entry of the counter array at `counters_offset` on every peer (release, system scope)."""
    for j in tl.static_range(1, NUM_RANKS):
        release_add(buf64 + (peer_offset(peer_offsets, (rank + j) % NUM_RANKS) >> 1) + counters_offset + rank)
