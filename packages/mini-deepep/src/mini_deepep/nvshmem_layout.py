"""Byte layout of the per-rank NVSHMEM symmetric buffer (pure Python; no NVSHMEM or Triton needed).

Every rank allocates the same `num_bytes`; a peer's copy is reached through its NVLink mapping at
(peer base - own base), so one offset describes a region on every rank.

    [ header, 512 KiB ][ dispatch area ][ combine area ]

Header (entry p of every per-source array is written only by peer p):
    int64 signals, one array of num_ranks entries each:
        NOTIFY[p]            epoch of p's last notify: its counts below are in place
        DISPATCH_CONSUMED[p] +1 by each receiving program of p's dispatch kernel once it is done with
                             this rank's slots on p (so this rank may overwrite them again)
        COMBINE_CONSUMED[p]  +1 by each reducing program of p's combine kernel once it is done with
                             the partials this rank stored on p
        DISPATCH_COUNT[p]    tokens p sends here in the current dispatch (its slots used here)
        SOURCE_TOKENS[p]     all of p's tokens in the current dispatch (how many chunks p signals)
        ERROR[0]             set to 1 on every rank by a wait that gave up (a hang turned into an
                             error); sticky: later waits see it and give up at once
    int64 combine work queue [2] at COMBINE_QUEUE_BYTE_OFFSET, local (only this rank's combine senders
        touch it): groups handed out in the current call, senders done. The last sender done sets both
        back to 0, so every call starts from 0.
    int64 NOTIFIED at NOTIFIED_BYTE_OFFSET, local: epoch of the last dispatch whose notify ran inside the data
        kernel (fuse_notify) and whose plan (segment bases, counts) is stored; that kernel's other receivers
        wait for it.
    int32 expert counts [R][MAX_LOCAL_EXPERTS] at EXPERT_COUNTS_BYTE_OFFSET: row p = how many of p's
        tokens picked each of this rank's experts (p's layout.num_tokens_per_expert slice).
    int64 dispatch chunk flags [R][MAX_CHUNKS]: entry (p, c) = epoch of the dispatch whose chunk c
        of p's tokens is stored here (rows, meta and the slot range below).
    int32 dispatch chunk ranges [R][MAX_CHUNKS][2]: slots [start, end) that chunk c of p's tokens
        filled here (start = end when none of them came here).
    int64 combine group flags [R][MAX_GROUPS]: entry (p, g) = epoch of the combine whose partials of
        slot group g (slots [g * GROUP, (g + 1) * GROUP) of this rank's tokens on p) are here. Finer
        than the dispatch chunks: combine senders take groups from a work queue in slot order, so the
        flags rise one group after another while the home rank's reducers wait for them.
Counters only grow and flags hold the call's epoch (its 1-based number, equal on every rank since
calls are collective), so nothing shared is ever reset, and a chunk unused for a while cannot confuse
a later call. (The combine work queue is local and reset by its own kernel, as described above.)

Dispatch area (int32 words): payload [R][slots][row_words], then meta [R][slots][meta_words]:
    (source token, K local expert ids or -1, K weights as fp32 bits, K ranks inside the expert
    among p's tokens). Slot i of source p holds p's i-th token for this rank (token order). A
    rank's own slots are not used: its tokens are expanded straight from x.
Combine area (bf16): partial sums [R][slots][hidden], slot i of expert rank p = this rank's token
    in its i-th slot on p (the dispatch send order); own slots unused likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_BYTES = 512 << 10
EXPERT_COUNTS_BYTE_OFFSET = 4096
MAX_LOCAL_EXPERTS = 1024
MAX_RANKS = 8
# Tokens per chunk: the unit of the per-chunk flags (one program stores a chunk, then signals it).
CHUNK = 32
MAX_CHUNKS = 1024  # per source rank: at most CHUNK * MAX_CHUNKS tokens per rank and call
# Slots per combine flag: the unit a combine sender takes from the work queue (docs/reports/deepep-v6-combine-queue.md).
GROUP = 8
MAX_GROUPS = CHUNK * MAX_CHUNKS // GROUP
COMBINE_QUEUE_BYTE_OFFSET = 2048
NOTIFIED_BYTE_OFFSET = COMBINE_QUEUE_BYTE_OFFSET + 16
DISPATCH_FLAGS_BYTE_OFFSET = 64 << 10
CHUNK_RANGES_BYTE_OFFSET = DISPATCH_FLAGS_BYTE_OFFSET + MAX_RANKS * MAX_CHUNKS * 8
COMBINE_FLAGS_BYTE_OFFSET = CHUNK_RANGES_BYTE_OFFSET + MAX_RANKS * MAX_CHUNKS * 8
ALIGN_BYTES = 256
NOTIFY, DISPATCH_CONSUMED, COMBINE_CONSUMED, DISPATCH_COUNT, SOURCE_TOKENS, ERROR = range(6)
NUM_SIGNALS = 6

assert COMBINE_FLAGS_BYTE_OFFSET + MAX_RANKS * MAX_GROUPS * 8 <= HEADER_BYTES
assert EXPERT_COUNTS_BYTE_OFFSET + MAX_RANKS * MAX_LOCAL_EXPERTS * 4 <= DISPATCH_FLAGS_BYTE_OFFSET
assert NUM_SIGNALS * MAX_RANKS * 8 <= COMBINE_QUEUE_BYTE_OFFSET
assert NOTIFIED_BYTE_OFFSET + 8 <= EXPERT_COUNTS_BYTE_OFFSET


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def meta_words(num_topk: int) -> int:
    """int32 words of metadata per dispatched token (1 + 3 * num_topk, padded to 16 bytes)."""
    return _round_up(1 + 3 * num_topk, 4)


@dataclass(frozen=True)
class SymmetricLayout:
    num_bytes: int
    num_ranks: int

    def __post_init__(self) -> None:
        if not 1 <= self.num_ranks <= MAX_RANKS:
            raise ValueError(f"{self.num_ranks} ranks: the NVSHMEM header holds 1..{MAX_RANKS} (intranode)")

    @property
    def area_bytes(self) -> int:
        return (self.num_bytes - HEADER_BYTES) // 2 // ALIGN_BYTES * ALIGN_BYTES

    def signal_offset(self, which: int) -> int:
        """Offset of a header signal array, in int64 words."""
        return which * self.num_ranks

    @property
    def expert_counts_offset(self) -> int:
        """Offset of the expert-count matrix, in int32 words."""
        return EXPERT_COUNTS_BYTE_OFFSET // 4

    @property
    def dispatch_flags_offset(self) -> int:
        """Offset of the dispatch chunk flags [R][MAX_CHUNKS], in int64 words."""
        return DISPATCH_FLAGS_BYTE_OFFSET // 8

    @property
    def combine_flags_offset(self) -> int:
        """Offset of the combine group flags [R][MAX_GROUPS], in int64 words."""
        return COMBINE_FLAGS_BYTE_OFFSET // 8

    @property
    def combine_queue_offset(self) -> int:
        """Offset of the combine work queue (int64 [2], local), in int64 words."""
        return COMBINE_QUEUE_BYTE_OFFSET // 8

    @property
    def notified_offset(self) -> int:
        """Offset of the local NOTIFIED epoch (int64), in int64 words."""
        return NOTIFIED_BYTE_OFFSET // 8

    @property
    def chunk_ranges_offset(self) -> int:
        """Offset of the dispatch chunk slot ranges [R][MAX_CHUNKS][2], in int32 words."""
        return CHUNK_RANGES_BYTE_OFFSET // 4

    @property
    def dispatch_offset(self) -> int:
        """Offset of the dispatch payload, in int32 words."""
        return HEADER_BYTES // 4

    @property
    def combine_offset(self) -> int:
        """Offset of the combine area, in bf16 elements."""
        return (HEADER_BYTES + self.area_bytes) // 2

    def dispatch_slots(self, row_words: int, num_topk: int) -> int:
        """Receive slots per source rank for rows of `row_words` int32 words."""
        per_slot = 4 * (row_words + meta_words(num_topk)) * self.num_ranks
        return max(0, (self.area_bytes - ALIGN_BYTES) // per_slot)

    def dispatch_meta_offset(self, row_words: int, slots: int) -> int:
        """Offset of the dispatch meta array, in int32 words (after the payload of `slots` slots)."""
        return self.dispatch_offset + _round_up(self.num_ranks * slots * row_words, ALIGN_BYTES // 4)

    def combine_slots(self, hidden: int) -> int:
        return self.area_bytes // (2 * hidden * self.num_ranks)

    @staticmethod
    def bytes_needed(max_tokens_per_rank: int, hidden: int, num_topk: int, num_ranks: int) -> int:
        """Bytes per rank for `max_tokens_per_rank` bf16 tokens of `hidden` per source rank (both areas)."""
        row_bytes = 2 * hidden + 4 * meta_words(num_topk)
        area = _round_up(num_ranks * max_tokens_per_rank * row_bytes, ALIGN_BYTES) + ALIGN_BYTES
        return HEADER_BYTES + 2 * area
