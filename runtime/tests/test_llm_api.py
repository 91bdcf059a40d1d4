"""The user API: LLM.generate on the fake model, bad input refused before any state changes, budget errors."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from mini_deepinfer import LLM, SamplingParams
from mini_deepinfer.engine.testing import FakeConfig, FakePagedCache, FakePagedModel, fake_generate

CFG = FakeConfig(vocab_size=512, eos_token_id=1)


def make_llm(**kw) -> LLM:
    base = dict(max_model_len=256, kv_cache_memory_gb=0.001, max_num_seqs=4, device="cpu", cache_cls=FakePagedCache)
    base.update(kw)
    return LLM(FakePagedModel(CFG), **base)


def test_generate_returns_outputs_in_prompt_order():
    llm = make_llm()
    prompts = [[5] * 37, [6] * 100, [7] * 3]
    sp = SamplingParams(temperature=0.9, max_tokens=5, seq_seed=3, ignore_eos=True)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == prompts
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == fake_generate(prompt, sp, 3, CFG, 256)[0]
        assert out.finish_reason == "length"
    per_prompt = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 2, 3)]
    outs = llm.generate(prompts, per_prompt, use_tqdm=True)
    assert [len(o.token_ids) for o in outs] == [1, 2, 3]
    assert llm.engine.scheduler.kv.all_free()


@pytest.mark.parametrize(
    "prompt,params,message",
    [
        ([], SamplingParams(), "empty prompt"),
        ([1, 512], SamplingParams(), "out of range"),
        ([1, -1], SamplingParams(), "out of range"),
        ([1.5], SamplingParams(), "integers"),
        ([3, True], SamplingParams(), "not bools"),
        (torch.tensor([1, 0], dtype=torch.bool), SamplingParams(), "not bools"),
        (torch.tensor([1.0, 2.0]), SamplingParams(), "integers"),
        (iter([3, 4, 512]), SamplingParams(), "out of range"),
        ([3, 4], SamplingParams(stop_token_ids=[7, 512]), "stop token id 512"),
        ([3] * 257, SamplingParams(), "longer than max_model_len"),
        (torch.tensor([[3, 4]]), SamplingParams(), "got a 2-D tensor"),
        (torch.tensor(3), SamplingParams(), "got a 0-D tensor"),
    ],
)
def test_bad_prompts_raise_before_any_state_changes(prompt, params, message):
    llm = make_llm()
    engine = llm.engine
    other = engine.add_request([9] * 50, SamplingParams(temperature=0.0, max_tokens=4, seq_seed=0, ignore_eos=True))
    with pytest.raises(ValueError, match=message):
        llm.generate([[4] * 10, prompt], params, use_tqdm=False)  # the good first prompt is not queued either
    assert list(engine._requests) == [other] and len(engine.scheduler.waiting) == 1
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    (out,) = outs
    assert out.token_ids == fake_generate([9] * 50, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                                          0, CFG, 256)[0]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(temperature=float("nan")), "temperature must be finite"),
        (dict(temperature=float("inf")), "temperature must be finite"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(stop_token_ids=[5, -1]), "stop_token_ids must be >= 0"),
    ],
)
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_tokens=2.5), "max_tokens must be an int"),
        (dict(max_tokens=True), "max_tokens must be an int"),
        (dict(top_k=2.0), "top_k must be an int"),
        (dict(seq_seed=1.5), "seq_seed must be an int"),
        (dict(temperature="1"), "temperature must be a number"),
        (dict(ignore_eos="no"), "ignore_eos must be a bool"),
        (dict(stop_token_ids=5), "stop_token_ids must be a list"),
        (dict(stop_token_ids="7"), "stop_token_ids must be a list"),
        (dict(stop_token_ids=[7, 8.0]), "stop_token_ids must be an int"),
    ],
)
def test_sampling_params_of_the_wrong_type_are_refused(kwargs, message):
    """Each of these was once accepted and then failed inside a step (a float seed), or silently sampled token 0 for
    ever (a NaN temperature), or stopped on nothing."""
    with pytest.raises(TypeError, match=message):
        SamplingParams(**kwargs)


def test_numpy_and_torch_scalars_become_python_numbers():
    import numpy as np

    sp = SamplingParams(temperature=np.float32(0.5), max_tokens=np.int64(4), top_k=torch.tensor(3).item(),
                        seq_seed=np.uint64(2**63), stop_token_ids=(np.int32(7),))
    assert (type(sp.temperature), type(sp.max_tokens), type(sp.seq_seed)) == (float, int, int)
    assert sp.stop_token_ids == [7] and type(sp.stop_token_ids[0]) is int and sp.seq_seed == 2**63


@pytest.mark.parametrize("flat", [[5, 6, 7], torch.tensor([5, 6, 7])], ids=["list", "tensor"])
def test_one_flat_prompt_of_ids_is_named(flat):
    """generate([5, 6, 7]) once failed on `'int' object is not iterable` inside the request check."""
    llm = make_llm()
    for kwargs in ({"prompts": flat}, {"prompt_token_ids": flat}):
        with pytest.raises(TypeError, match=r"generate\(\[\[5, 6, 7\]\]\), not generate\(\[5, 6, 7\]\)"):
            llm.generate(**kwargs, use_tqdm=False)
    with pytest.raises(ValueError, match="a prompt is a sequence or 1-D tensor of token ids, got 5"):
        llm.engine.add_request(5, SamplingParams())
    assert not llm.engine.has_unfinished_requests()


def test_a_vanishing_temperature_with_top_p_is_greedy_and_the_batch_goes_on():
    """temperature 1e-38 with top_p once raised inside a step (test_sampler.py), losing every request in flight."""
    llm = make_llm()
    prompts = [[4] * 10, [7] * 20]
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    params = [SamplingParams(temperature=1e-38, top_p=0.9, max_tokens=4, seq_seed=1, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy]


def test_params_list_must_match_prompts():
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        make_llm().generate([[3, 4]], [SamplingParams(), SamplingParams()], use_tqdm=False)


def test_kv_budget_too_small_for_one_sequence():
    with pytest.raises(ValueError, match="too small"):
        make_llm(max_model_len=4096, kv_cache_memory_gb=1e-5)
    with pytest.raises(ValueError, match="gpu_memory_utilization needs a CUDA device"):
        make_llm(kv_cache_memory_gb=None, gpu_memory_utilization=0.5)


def test_bad_engine_limits():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_llm(max_num_seqs=8, max_num_batched_tokens=4)


def test_abort_is_harmless_for_unknown_and_finished_requests():
    llm = make_llm()
    llm.engine.abort_request("never-existed")
    (out,) = llm.generate([[3] * 5], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.engine.abort_request(out.request_id)
    assert not llm.engine.has_unfinished_requests()


def test_same_seed_same_output_whatever_the_batch():
    llm = make_llm()
    sp = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=6, seq_seed=123)
    alone = llm.generate([[8] * 40], sp, use_tqdm=False)[0].token_ids
    batched = llm.generate([[2] * 90, [8] * 40, [9] * 10], sp, use_tqdm=False)[1].token_ids
    assert alone == batched


def test_a_model_module_needs_its_cache_class():
    with pytest.raises(ValueError, match="cache class"):
        LLM(FakePagedModel(CFG), kv_cache_memory_gb=0.001, device="cpu")


def test_unknown_checkpoint_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        LLM(str(tmp_path / "missing"), device="cpu")


def test_default_device_and_cpu_budget():
    llm = LLM(FakePagedModel(CFG), cache_cls=FakePagedCache, max_model_len=256, max_num_seqs=2,
              device=None if not torch.cuda.is_available() else "cpu")
    assert llm.engine.device.type == "cpu" and llm.engine.cache_plan.num_blocks == 2 * 2 + 1


def test_a_dropped_llm_frees_its_engine_and_weights_without_the_cycle_collector():
    """Promise 2 for the whole engine: dropping the LLM releases the engine, the model and its weights at once, by
    reference counting. A reference cycle through them would keep a model's weights (gigabytes on a GPU) alive until
    the cyclic collector ran, at a moment nobody chose (inside a CUDA-graph capture, session 57's capture errors)."""
    llm = LLM("tiny", max_model_len=64, max_num_seqs=2, kv_cache_memory_gb=0.01, device="cpu")
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    model = llm.engine.runner.model
    held = [weakref.ref(x) for x in (llm.engine, llm.engine.runner, model, next(iter(model.w.values())))]
    del model
    gc.disable()
    try:
        del llm
        assert [r() is None for r in held] == [True] * len(held), "a reference cycle keeps the engine alive"
    finally:
        gc.enable()
