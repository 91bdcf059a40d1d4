"""Byte layout of the per-rank NVSHMEM symmetric buffer (pure Python; no NVSHMEM or Triton needed).

Every rank allocates the same `num_bytes`; a peer's copy is reached through its NVLink mapping at
(peer base - own base), so one offset describes a region on every rank.

    [ header: int64 signals | int32 expert counts, 64 KiB ][ dispatch area ][ combine area ]

Header signals: int64 arrays of num_ranks entries, entry p written (only) by peer p:
    DISPATCH_ARRIVED[p]  +1 by each program of p's dispatch-send kernel once its rows are stored here
    DISPATCH_CONSUMED[p] +1 by each program of p's expand kernel once it has read p's receive area
                         (so this rank may overwrite its slots on p again)
    COMBINE_ARRIVED[p], COMBINE_CONSUMED[p]: the same for combine
    DISPATCH_COUNT[p]    number of tokens p sent here in the current dispatch
    ERROR[0]             set to 1 on every rank by a wait that gave up (a hang turned into an error);
                         sticky: later waits see it and give up at once
Counters only grow; the host keeps the running target of each, so nothing is ever reset.
Header expert counts (at EXPERT_COUNTS_BYTE_OFFSET): int32 [R][MAX_LOCAL_EXPERTS], row p = how many
    of p's tokens picked each of this rank's experts (p's layout.num_tokens_per_expert slice).

Dispatch area (int32 words): payload [R][slots][row_words], then meta [R][slots][meta_words]:
    (source token, K local expert ids or -1, K weights as fp32 bits, K ranks inside the expert
    among p's tokens). Slot i of source p holds p's i-th token for this rank (token order).
Combine area (bf16): partial sums [R][slots][hidden], slot i of expert rank p = this rank's token
    in its i-th slot on p (the dispatch send order).
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_BYTES = 64 << 10
EXPERT_COUNTS_BYTE_OFFSET = 4096
MAX_LOCAL_EXPERTS = 1024
ALIGN_BYTES = 256
DISPATCH_ARRIVED, DISPATCH_CONSUMED, COMBINE_ARRIVED, COMBINE_CONSUMED, DISPATCH_COUNT, ERROR = range(6)


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
        if 6 * self.num_ranks * 8 > EXPERT_COUNTS_BYTE_OFFSET or self.expert_counts_offset + self.num_ranks * MAX_LOCAL_EXPERTS > HEADER_BYTES // 4:
            raise ValueError(f"{self.num_ranks} ranks do not fit the header")

    @property
    def area_bytes(self) -> int:
        return (self.num_bytes - HEADER_BYTES) // 2 // ALIGN_BYTES * ALIGN_BYTES

    def signal_offset(self, which: int) -> int:
        """Offset of a header array, in int64 words."""
        return which * self.num_ranks

    @property
    def expert_counts_offset(self) -> int:
        """Offset of the expert-count matrix, in int32 words."""
        return EXPERT_COUNTS_BYTE_OFFSET // 4

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
