"""Scheduler decisions, step by step: admission, budget, chunking, decode, preemption, the prefill interval, ZOS."""

from __future__ import annotations

import pytest

from mini_deepinfer.engine.block_manager import BLOCK_SIZE, KVCacheManager
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from mini_deepinfer.engine.sequence import FinishReason, Sequence, SequenceStatus


def make(num_blocks=64, num_slots=9, **cfg) -> Scheduler:
    base = dict(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024)
    base.update(cfg)
    return Scheduler(SchedulerConfig(**base), KVCacheManager(num_blocks, num_slots))


def seq(name: str, n: int, max_tokens: int = 100) -> Sequence:
    return Sequence(name, [7] * n, SamplingParams(max_tokens=max_tokens), seed=1)


def process(step: ScheduledStep, token: int = 5) -> None:
    """What the engine does with a finished step: append one token per sampled, still-current sequence."""
    for s in step.sampled:
        if s.epoch == s.seq.epoch:
            s.seq.num_inflight_tokens -= 1
            s.seq.token_ids.append(token)


def names(step: ScheduledStep) -> list[str]:
    return [s.seq.request_id for s in step.sequences]


def test_fcfs_admission_stops_at_a_head_of_line_prompt_that_does_not_fit():
    sch = make(num_blocks=4)  # 3 usable blocks
    big, small_a, small_b = seq("big", 2 * BLOCK_SIZE + 1), seq("a", 10), seq("b", 10)
    for s in (small_a, big, small_b):
        sch.add(s)
    step = sch.schedule()
    assert step.is_prefill and names(step) == ["a"]  # big needs 3 blocks, 2 are free: b must not jump ahead
    assert [s.request_id for s in sch.waiting] == ["big", "b"]


def test_prefill_respects_the_token_budget_and_samples_every_complete_prompt():
    sch = make(max_num_batched_tokens=300, chunked_prefill=False, max_model_len=300)
    for name, n in [("a", 100), ("b", 150), ("c", 100)]:
        sch.add(seq(name, n))
    step = sch.schedule()
    assert names(step) == ["a", "b"] and step.num_batched_tokens == 250
    assert [(s.context_len, s.query_len, s.sample_position) for s in step.sequences] == [(0, 100, 0), (0, 150, 0)]
    assert all(s.block_table and s.state_slot for s in step.sequences)
    assert [s.request_id for s in sch.waiting] == ["c"]


def test_chunked_prefill_one_partial_prompt_per_step_last_chunk_samples():
    sch = make(max_num_batched_tokens=128)
    long, short = seq("long", 300), seq("short", 20)
    sch.add(long)
    sch.add(short)
    chunks = []
    for _ in range(3):
        step = sch.schedule()
        assert step.is_prefill
        chunks.append([(s.seq.request_id, s.context_len, s.query_len, s.sample_position) for s in step.sequences])
        process(step)
    assert chunks == [
        [("long", 0, 128, None)],
        [("long", 128, 128, None)],
        [("long", 256, 44, 0), ("short", 0, 20, 0)],
    ]
    # the partial prompt held its blocks (for all 300 tokens) and its slot from the first chunk on
    assert len(long.block_table) == 3 and long.status == SequenceStatus.RUNNING


def test_chunk_inputs_are_the_prompt_slices():
    sch = make(max_num_batched_tokens=200)
    s = Sequence("p", list(range(1, 301)), SamplingParams(), seed=0)
    sch.add(s)
    first, second = sch.schedule(), sch.schedule()
    assert first.sequences[0].input_token_ids == list(range(1, 201))
    assert second.sequences[0].input_token_ids == list(range(201, 301))


def test_a_partial_prompt_counts_against_max_num_seqs():
    sch = make(max_num_seqs=2, max_num_batched_tokens=128)
    for name, n in [("a", 10), ("long", 200), ("b", 10), ("c", 10)]:
        sch.add(seq(name, n))
    assert names(sch.schedule()) == ["a", "long"]  # long: first chunk of 118 tokens
    process(sch.schedule())  # long's last chunk; "b" must not join: a and long already hold the 2 seats
    assert [s.request_id for s in sch.running] == ["a", "long"] and sch.waiting[0].request_id == "b"


def test_without_chunking_a_prompt_over_the_remaining_budget_waits():
    sch = make(max_num_batched_tokens=256, chunked_prefill=False, max_model_len=256)
    sch.add(seq("a", 200))
    sch.add(seq("b", 100))
    assert names(sch.schedule()) == ["a"]
    assert [s.request_id for s in sch.waiting] == ["b"]


def test_decode_advances_every_running_sequence_by_one_in_admission_order():
    sch = make()
    for name in "abc":
        sch.add(seq(name, 10))
    process(sch.schedule())
    step = sch.schedule()
    assert not step.is_prefill and names(step) == ["a", "b", "c"]
    assert all(s.query_len == 1 and s.context_len == 10 and s.sample_position == 1 for s in step.sequences)
    assert all(s.input_token_ids == [5] and not s.input_in_flight for s in step.sequences)


def test_max_num_seqs_caps_admission():
    sch = make(max_num_seqs=2, max_num_batched_tokens=64)
    for name in "abc":
        sch.add(seq(name, 10))
    assert names(sch.schedule()) == ["a", "b"]


def test_preempts_the_longest_output_requeues_it_at_the_head_and_recomputes():
    sch = make(num_blocks=4, prefill_attempt_interval=1)  # 3 usable blocks
    a, b = seq("a", BLOCK_SIZE - 2), seq("b", BLOCK_SIZE)
    sch.add(b)
    process(sch.schedule())  # b prefilled (1 block), 1 output
    process(sch.schedule())  # decode at position 128: b takes its second block, 2 outputs
    sch.add(a)
    process(sch.schedule())  # a prefilled into the last free block
    process(sch.schedule())  # decode: a writes position 126, b 129
    process(sch.schedule())  # decode: a writes position 127, b 130
    assert (a.num_output_tokens, b.num_output_tokens, sch.kv.blocks.num_free) == (3, 4, 0)
    epoch_before = b.epoch
    step = sch.schedule()  # a needs a block for position 128: b, the longest output, is preempted
    assert [s.request_id for s in step.preempted] == ["b"] and names(step) == ["a"]
    assert b.status == SequenceStatus.WAITING and sch.waiting[0] is b and b.epoch == epoch_before + 1
    assert b.block_table == [] and b.state_slot == 0 and b.num_cached_tokens == 0 and b.num_inflight_tokens == 0
    # when a finishes, b is recomputed from scratch: prompt + its outputs, sampling its next output position
    process(step)
    sch.finish(a, FinishReason.STOP)
    step = sch.schedule()
    (r,) = step.sequences
    assert step.is_prefill and r.seq is b and r.context_len == 0
    assert r.query_len == len(b.token_ids) == BLOCK_SIZE + 4 and r.sample_position == 4


def test_a_sequence_that_cannot_grow_alone_is_preempted_itself():
    sch = make(num_blocks=2, prefill_attempt_interval=1000)  # one usable block
    a = seq("a", BLOCK_SIZE)
    sch.add(a)
    process(sch.schedule())  # 128 prompt tokens fill the block; the next position needs a second block
    step = sch.schedule()
    assert step.preempted == [a] and step.is_empty


def test_prefill_attempt_interval():
    sch = make(num_blocks=3, prefill_attempt_interval=3)  # 2 usable blocks
    sch.add(seq("a", 10))
    sch.add(seq("big", 2 * BLOCK_SIZE))
    kinds = []
    for _ in range(8):
        step = sch.schedule()
        kinds.append("P" if step.is_prefill else "D")
        process(step)
        if len(kinds) == 4:
            sch.add(seq("c", 10))  # fits, but sits behind "big", which never fits while "a" runs
    assert kinds == ["P", "D", "D", "D", "D", "D", "D", "D"]
    # attempts after 0, 3 and 6 decode steps all stop at "big" (head of line, never fits next to "a"): decode goes on
    sch2 = make(prefill_attempt_interval=3)
    sch2.add(seq("a", 10))
    kinds = []
    for i in range(6):
        if i == 2:
            sch2.add(seq("late", 10))
        step = sch2.schedule()
        kinds.append("P" if step.is_prefill else "D")
        process(step)
    # "late" arrives after 1 decode step and is admitted at the next attempt point, 3 decode steps after the prefill
    assert kinds == ["P", "D", "D", "D", "P", "D"]


def test_zos_reservations_decode_on_an_in_flight_token():
    sch = make()
    a = seq("a", 10)
    sch.add(a)
    first = sch.schedule()  # prefill, sample in flight
    assert a.get_len() == 11 and a.num_cached_tokens == 10 and len(a.token_ids) == 10
    second = sch.schedule()  # scheduled before the first is processed: the input token is still on the device
    (r,) = second.sequences
    assert r.input_in_flight and r.input_token_ids == [] and r.context_len == 10 and r.sample_position == 1
    assert a.get_len() == 12 and a.num_cached_tokens == 11
    process(first)
    third = sch.schedule()
    assert third.sequences[0].input_in_flight and third.sequences[0].context_len == 11


def test_a_sequence_whose_last_token_is_in_flight_is_not_scheduled():
    sch = make()
    a = seq("a", 10, max_tokens=1)
    sch.add(a)
    sch.schedule()
    assert sch.schedule().is_empty  # its only output token is in flight; nothing more to compute


def test_finish_releases_resources_from_any_queue():
    sch = make(max_num_batched_tokens=128)
    a, b = seq("a", 10), seq("b", 300)
    sch.add(a)
    sch.add(b)
    sch.schedule()  # a complete, b's first chunk: b is mid prefill at the head of waiting, holding resources
    assert b.holds_resources and sch.waiting[0] is b
    sch.finish(b, FinishReason.ABORT)
    sch.finish(a, FinishReason.STOP)
    sch.finish(a, FinishReason.ABORT)  # finishing twice is a no-op
    assert a.finish_reason == FinishReason.STOP and b.finish_reason == FinishReason.ABORT
    assert not sch.has_unfinished() and sch.kv.all_free()


def test_config_validation():
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="chunked prefill"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256, chunked_prefill=False)
