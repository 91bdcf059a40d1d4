"""Block and state-slot ownership: sentinel, OK/LATER/NEVER, paired release, no leak under any operation mix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_deepinfer.engine.block_manager import BLOCK_SIZE, AllocStatus, BlockManager, KVCacheManager, blocks_for
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.sequence import Sequence


def make_seq(i: int, n: int = 5) -> Sequence:
    return Sequence(f"r{i}", list(range(1, n + 1)), SamplingParams(), seed=i)


def test_sentinel_is_never_handed_out_and_reuse_is_fifo():
    bm = BlockManager(5)
    ids = bm.allocate(4)
    assert ids == [1, 2, 3, 4] and bm.num_free == 0
    assert bm.can_allocate(1) == AllocStatus.LATER
    assert bm.can_allocate(5) == AllocStatus.NEVER
    bm.free([2, 3])  # released in reverse: 3 then 2
    assert bm.allocate(2) == [3, 2]


def test_double_free_and_foreign_ids_are_errors():
    bm = BlockManager(4)
    ids = bm.allocate(2)
    bm.free(ids)
    with pytest.raises(RuntimeError):
        bm.free(ids)
    with pytest.raises(RuntimeError):
        bm.free([0])
    with pytest.raises(RuntimeError):
        bm.allocate(4)
    with pytest.raises(ValueError):
        BlockManager(1)


def test_blocks_and_slot_are_acquired_together_or_not_at_all():
    kv = KVCacheManager(num_blocks=4, num_slots=2)  # 3 usable blocks, 1 usable slot
    assert kv.can_allocate(3 * BLOCK_SIZE) == AllocStatus.OK
    assert kv.can_allocate(3 * BLOCK_SIZE + 1) == AllocStatus.NEVER
    a, b = make_seq(0), make_seq(1)
    kv.allocate(a, BLOCK_SIZE + 1)
    assert len(a.block_table) == 2 and a.state_slot == 1
    # one block is free but no slot: LATER, and nothing is taken
    assert kv.can_allocate(1) == AllocStatus.LATER
    with pytest.raises(RuntimeError):
        kv.allocate(b, 1)
    assert kv.blocks.num_free == 1 and not b.holds_resources
    kv.free(a)
    assert kv.all_free() and a.block_table == [] and a.state_slot == 0
    kv.free(a)  # freeing a sequence that holds nothing is harmless


def test_grow_extends_the_table_only_when_needed():
    kv = KVCacheManager(num_blocks=4, num_slots=3)
    a = make_seq(0)
    kv.allocate(a, BLOCK_SIZE)
    kv.grow(a, BLOCK_SIZE)
    assert len(a.block_table) == 1
    assert kv.can_grow(a, BLOCK_SIZE + 1)
    kv.grow(a, BLOCK_SIZE + 1)
    assert len(a.block_table) == 2
    assert not kv.can_grow(a, 3 * BLOCK_SIZE + 1)
    kv.free(a)
    assert kv.all_free()


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "grow", "finish", "preempt", "abort"]), st.integers(0, 7), st.integers(1, 700)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(2, 12), num_slots=st.integers(2, 5), operations=ops)
def test_no_leak_and_paired_ownership_under_any_operation_mix(num_blocks, num_slots, operations):
    kv = KVCacheManager(num_blocks, num_slots)
    seqs = [make_seq(i) for i in range(8)]
    for op, i, n in operations:
        s = seqs[i]
        if op == "admit" and not s.holds_resources:
            status = kv.can_allocate(n)
            if status == AllocStatus.OK:
                kv.allocate(s, n)
            else:
                with pytest.raises(RuntimeError):
                    kv.allocate(s, n)
                assert not s.holds_resources and s.block_table == []
                expected_never = blocks_for(n) > num_blocks - 1
                assert (status == AllocStatus.NEVER) == expected_never
        elif op == "grow" and s.holds_resources:
            target = len(s.block_table) * BLOCK_SIZE + n
            if kv.can_grow(s, target):
                kv.grow(s, target)
        elif op in ("finish", "preempt", "abort"):
            kv.free(s)
        # Invariants after every operation: each id has exactly one owner; a sequence holds a slot iff it holds
        # a block table; the free counts add up.
        owned_blocks = [b for q in seqs for b in q.block_table]
        owned_slots = [q.state_slot for q in seqs if q.holds_resources]
        assert len(owned_blocks) == len(set(owned_blocks)) and 0 not in owned_blocks
        assert len(owned_slots) == len(set(owned_slots))
        assert all(bool(q.block_table) == q.holds_resources for q in seqs)
        assert kv.blocks.num_free + len(owned_blocks) == num_blocks - 1
        assert kv.slots.num_free + len(owned_slots) == num_slots - 1
    for s in seqs:
        kv.free(s)
    assert kv.all_free()
