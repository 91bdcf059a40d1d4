"""Ownership of the two kinds of cache state: paged KV blocks and per-sequence state slots.

V4.1 keeps compressed KV and index keys in pages of BLOCK_SIZE tokens, and the sliding-window ring, the
compressor tail and the Engram history in one state slot per sequence. A sequence needs both, so
`KVCacheManager` hands them out together or not at all, and takes them back together.
"""

from __future__ import annotations

import enum
from collections import deque

from mini_deepinfer.engine.sequence import Sequence

BLOCK_SIZE = 128


class AllocStatus(enum.Enum):
    OK = "ok"  # enough free now
    LATER = "later"  # fits the pool, not free now: wait for others to finish
    NEVER = "never"  # larger than the whole pool


class BlockManager:
    """A pool of ids 1..num_ids-1 with reference counts; id 0 is a sentinel that is never handed out.

    Freed ids go to the tail of the free list and are handed out from its head (FIFO reuse), so a just-freed id is
    reused as late as possible. The reference count turns a double free or a free of a never-allocated id into an
    error instead of a silent double ownership.
    """

    def __init__(self, num_ids: int) -> None:
        if num_ids < 2:
            raise ValueError(f"BlockManager needs at least 2 ids (id 0 is a sentinel), got {num_ids}")
        self.num_ids = num_ids
        self.ref_counts = [0] * num_ids
        self._free: deque[int] = deque(range(1, num_ids))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        return self.num_ids - 1

    def can_allocate(self, n: int) -> AllocStatus:
        if n > self.num_usable:
            return AllocStatus.NEVER
        return AllocStatus.OK if n <= self.num_free else AllocStatus.LATER

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"BlockManager: asked for {n} ids, {self.num_free} free")
        ids = [self._free.popleft() for _ in range(n)]
        for i in ids:
            self.ref_counts[i] = 1
        return ids

    def free(self, ids: list[int]) -> None:
        for i in reversed(ids):  # the table's tail was allocated last; returning it first keeps FIFO reuse order
            if not 0 < i < self.num_ids or self.ref_counts[i] <= 0:
                raise RuntimeError(f"BlockManager: freeing id {i}, which is not allocated")
            self.ref_counts[i] -= 1
            if self.ref_counts[i] == 0:
                self._free.append(i)

    def all_free(self) -> bool:
        return self.num_free == self.num_usable and not any(self.ref_counts)


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


class KVCacheManager:
    """Blocks and state slots for sequences, acquired together or not at all, released together.

    Free only the blocks and the scheduler sees spare KV while the next request finds no state slot, so there is
    no public way to release one without the other.
    """

    def __init__(self, num_blocks: int, num_slots: int) -> None:
        self.blocks = BlockManager(num_blocks)
        self.slots = BlockManager(num_slots)

    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """Could a sequence that holds nothing get blocks for num_tokens tokens plus one state slot?"""
        statuses = (self.blocks.can_allocate(blocks_for(num_tokens)), self.slots.can_allocate(1))
        if AllocStatus.NEVER in statuses:
            return AllocStatus.NEVER
        return AllocStatus.LATER if AllocStatus.LATER in statuses else AllocStatus.OK

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        if seq.holds_resources:
            raise RuntimeError(f"{seq.request_id} already holds a block table and a state slot")
        if self.can_allocate(num_tokens) != AllocStatus.OK:
            raise RuntimeError(f"cannot allocate {num_tokens} tokens for {seq.request_id} now")
        seq.state_slot = self.slots.allocate(1)[0]
        seq.block_table = self.blocks.allocate(blocks_for(num_tokens))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Can the sequence's block table be extended to cover num_tokens tokens?"""
        return blocks_for(num_tokens) - len(seq.block_table) <= self.blocks.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        missing = blocks_for(num_tokens) - len(seq.block_table)
        if missing > 0:
            seq.block_table.extend(self.blocks.allocate(missing))

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks and its state slot (a no-op for a sequence that holds nothing)."""
        if not seq.holds_resources:
            return
        self.blocks.free(seq.block_table)
        self.slots.free([seq.state_slot])
        seq.block_table = []
        seq.state_slot = 0

    def all_free(self) -> bool:
        return self.blocks.all_free() and self.slots.all_free()
