"""The engine against a sequential oracle, in every scheduling mode, on the state-sensitive fake model.

FakePagedModel's logits are an exact function of the state it reads back (pages + slot), so the engine must
reproduce the oracle's logits bit for bit and its tokens exactly, whatever the batching, ZOS, chunking or
preemption. Metric: exact equality of token ids, finish reasons and logits.
"""

from __future__ import annotations

import random

import pytest
import torch

from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.testing import FakeConfig, FakePagedCache, FakePagedModel, fake_generate

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CFG = FakeConfig(vocab_size=512, eos_token_id=1)
MAX_MODEL_LEN = 512


def blocks_budget_gb(num_blocks: int, max_num_seqs: int) -> float:
    """A KV budget of exactly num_blocks blocks (sentinel included) next to max_num_seqs + 1 slots."""
    return (num_blocks * FakePagedCache.bytes_per_block(CFG) + (max_num_seqs + 1) * 16) / 2**30


def make_engine(device="cpu", num_blocks=64, max_num_seqs=8, **kw) -> LLMEngine:
    config = EngineConfig(
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_seqs,
        kv_cache_memory_gb=blocks_budget_gb(num_blocks, max_num_seqs),
        record_logits=True,
        **kw,
    )
    return LLMEngine(FakePagedModel(CFG), FakePagedCache, config, device)


def workload(n=6, seed=0) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, seq_seed=11),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=14, seq_seed=2**64 - 5),
        SamplingParams(temperature=1.3, max_tokens=9, seq_seed=7, stop_token_ids=[3, 4, 5, 6, 7, 8]),
    ]
    lengths = [37, 300, 129, 200, 64, 255, 128, 90]
    return [([rng.randrange(2, CFG.vocab_size) for _ in range(lengths[i % 8])], params[i % 4]) for i in range(n)]


def run(engine: LLMEngine, requests, abort_after: dict[str, int] | None = None) -> dict[str, object]:
    ids = [engine.add_request(p, sp, request_id=f"r{i}") for i, (p, sp) in enumerate(requests)]
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        for rid, at_step in (abort_after or {}).items():
            if engine.num_steps == at_step:
                engine.abort_request(rid)
    assert set(outputs) == set(ids)
    assert engine.scheduler.kv.all_free(), "blocks or slots leaked"
    return outputs


def check_against_oracle(outputs, requests, skip=()):
    for i, (prompt, sp) in enumerate(requests):
        rid = f"r{i}"
        if rid in skip:
            continue
        out = outputs[rid]
        tokens, reason, logits = fake_generate(prompt, sp, sp.seq_seed if sp.seq_seed is not None else 0, CFG,
                                               MAX_MODEL_LEN)
        assert out.token_ids == tokens, rid
        assert out.finish_reason == reason, rid
        assert len(out.logits) == len(logits)
        for got, want in zip(out.logits, logits):
            assert torch.equal(got.cpu(), want), rid


def with_fixed_seeds(requests):
    """Give every request without a seed the seed 0 (the oracle needs to know it)."""
    fixed = []
    for prompt, sp in requests:
        if sp.seq_seed is None:
            sp = SamplingParams(**{**sp.__dict__, "seq_seed": 0})
        fixed.append((prompt, sp))
    return fixed


MODES = {
    "zos_on": dict(enable_zos=True),
    "zos_off": dict(enable_zos=False),
    "chunk128_zos": dict(enable_zos=True, max_num_batched_tokens=128),
    "chunk200_nozos": dict(enable_zos=False, max_num_batched_tokens=200),
    "no_chunking": dict(chunked_prefill=False, max_num_batched_tokens=MAX_MODEL_LEN),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", list(MODES))
def test_engine_matches_the_sequential_oracle(device, mode):
    requests = with_fixed_seeds(workload())
    engine = make_engine(device, **MODES[mode])
    check_against_oracle(run(engine, requests), requests)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zos", [True, False])
@pytest.mark.parametrize("chunk", [128, 4096])
def test_forced_preemption_recomputes_the_same_tokens(device, zos, chunk):
    # prompts just short of a block boundary: 5 blocks at admission, 9 once every output crosses it; 7 usable
    requests = [(prompt[:n], sp) for (prompt, sp), n in zip(with_fixed_seeds(workload(n=4)), [120, 250, 125, 126])]
    requests[1] = ([3] * 250, requests[1][1])
    engine = make_engine(device, num_blocks=8, enable_zos=zos, max_num_batched_tokens=chunk, prefill_attempt_interval=2)
    outputs = run(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    check_against_oracle(outputs, requests)


@pytest.mark.parametrize("zos", [True, False])
def test_order_of_requests_does_not_change_any_output(zos):
    requests = with_fixed_seeds(workload())
    forward = run(make_engine(enable_zos=zos), requests)
    engine = make_engine(enable_zos=zos)
    for i in reversed(range(len(requests))):
        engine.add_request(*requests[i], request_id=f"r{i}")
    backward = {}
    while engine.has_unfinished_requests():
        backward.update({o.request_id: o for o in engine.step()})
    one_by_one = {}
    for i, req in enumerate(requests):
        single = make_engine(enable_zos=zos)
        single.add_request(*req, request_id=f"r{i}")
        while single.has_unfinished_requests():
            one_by_one.update({o.request_id: o for o in single.step()})
    for rid in forward:
        assert forward[rid].token_ids == backward[rid].token_ids == one_by_one[rid].token_ids


@pytest.mark.parametrize("zos", [True, False])
def test_abort_of_one_request_leaves_the_others_unchanged(zos):
    requests = with_fixed_seeds(workload(n=4))
    engine = make_engine(enable_zos=zos, max_num_batched_tokens=128)
    outputs = run(engine, requests, abort_after={"r1": 4, "r2": 7})
    check_against_oracle(outputs, requests, skip={"r1", "r2"})
    for rid in ("r1", "r2"):
        i = int(rid[1:])
        assert outputs[rid].finish_reason == "abort"
        full, _, _ = fake_generate(*requests[i], requests[i][1].seq_seed, CFG, MAX_MODEL_LEN)
        assert outputs[rid].token_ids == full[: len(outputs[rid].token_ids)]
    engine.abort_request("r0")  # finished: harmless
    engine.abort_request("nobody")  # unknown: harmless
    assert not engine.has_unfinished_requests()


def test_abort_while_waiting_and_mid_chunked_prefill():
    engine = make_engine(max_num_batched_tokens=128, max_num_seqs=2)
    engine.add_request(list(range(2, 302)), SamplingParams(max_tokens=3, seq_seed=0), request_id="long")
    engine.add_request([5] * 40, SamplingParams(max_tokens=3, seq_seed=0), request_id="a")
    engine.add_request([6] * 40, SamplingParams(max_tokens=3, seq_seed=0), request_id="b")
    engine.add_request([7] * 40, SamplingParams(max_tokens=3, seq_seed=0), request_id="c")
    engine.step()  # first chunk of "long"; it holds its blocks and slot at the head of the waiting queue
    engine.abort_request("long")
    engine.abort_request("c")  # still waiting, holds nothing
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step()})
    reasons = {k: v.finish_reason for k, v in outs.items()}
    assert reasons == {"long": "abort", "c": "abort", "a": "length", "b": "length"}
    assert outs["long"].token_ids == [] and engine.scheduler.kv.all_free()


def test_stop_tokens_eos_and_ignore_eos():
    prompt = [9] * 50
    probe = fake_generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), 0, CFG, 512)[0]
    stop_at = probe[3]
    engine = make_engine()
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop_at]), "s")
    eos_cfg = FakeConfig(vocab_size=512, eos_token_id=probe[2])
    eos_engine = LLMEngine(FakePagedModel(eos_cfg), FakePagedCache,
                           EngineConfig(max_model_len=512, max_num_seqs=4, kv_cache_memory_gb=0.001), "cpu")
    eos_engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8), "eos")
    eos_engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), "ignore")
    outs = {}
    for e in (engine, eos_engine):
        while e.has_unfinished_requests():
            outs.update({o.request_id: o for o in e.step()})
    first_stop = probe.index(stop_at)
    assert outs["s"].token_ids == probe[: first_stop + 1] and outs["s"].finish_reason == "stop"
    assert outs["eos"].token_ids == probe[: probe.index(probe[2]) + 1] and outs["eos"].finish_reason == "stop"
    assert outs["ignore"].token_ids == probe and outs["ignore"].finish_reason == "length"


def test_max_model_len_finishes_with_length_and_timings_are_ordered():
    engine = make_engine()
    engine.add_request([4] * (MAX_MODEL_LEN - 3), SamplingParams(max_tokens=100, seq_seed=1, ignore_eos=True), "x")
    (out,) = [o for _ in range(20) for o in engine.step()]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert m.time_to_first_token > 0 and m.latency >= m.time_to_first_token


def test_slot_reuse_needs_a_reset():
    """One slot serves many sequences in turn; each must start from a fresh state (the model resets at ctx 0)."""
    requests = with_fixed_seeds(workload(n=5))
    engine = make_engine(max_num_seqs=1)
    check_against_oracle(run(engine, requests), requests)
    assert engine.cache_plan.num_slots == 2
