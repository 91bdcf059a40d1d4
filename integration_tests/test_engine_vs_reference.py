"""The engine on the tiny checkpoint against the sequential reference model, in every scheduling mode.

The engine (batched, paged, quantized cache, ZOS, chunking, preemption) runs greedy requests; the reference
(unpaged, one sequence at a time: prefill, then one decode call per token) is fed the engine's tokens, so the
logits of every step can be compared.

A request run alone and unchunked (paging, ZOS remap) reproduces the reference's logits to ~1e-6 on CPU, and
must stay within 0.05 (max |difference|, the seed runtime's bar against DeepSeek's reference).
In a batch it cannot always: CPU kernels round some ops differently for a different number of rows (measured:
the first difference is one bf16 ulp at layer 5 of the tiny model, independent of what the other sequences
contain), and the FP8/FP4 requantization of the later layers amplifies it to 2.6% relative at the last layer and
0.07-0.19 in the logits. So batched modes are held to:
  * logits cosine >= 0.998 for every sampled row (observed >= 0.99925 for that rounding noise; changing one token
    260 positions back already gives 0.997), with the max |difference| printed (pytest -s) for the record;
  * greedy tokens == reference argmax up to the reference's first near tie, a top-2 margin below
    max(0.05, twice the row's measured logits difference): past it both sides compare noise.
A sequence recomputed after preemption samples its next output at the end of a prefill over prompt + outputs,
and the reference itself does not give the same logits for a position by prefill and by decode (the shipped
reference's index-key hand-off quirk, spec 2.4: 0.58 apart at position 39 of the 37-token prompt, 1e-6 with the
quirk off). So the reference follows the engine's path: a prefill of prompt + outputs where the engine
recomputed, decode steps elsewhere.

Chunked prefill and the CUDA kernel path have their own calibrated cosine bars (MIN_COSINE_CHUNKED,
MIN_COSINE_CUDA below, with the measurements behind them); the greedy-token rule applies everywhere.
CPU runs three short prompts (37, 126, 260 tokens, so that 128- and 200-token chunks split them and the 126-token
prompt crosses a block boundary while decoding); CUDA adds one of 600 tokens.
"""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine
from mini_deepinfer.engine.sampling_params import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT_LENS = [37, 126, 260] + ([600] if DEVICE == "cuda" else [])
MAX_TOKENS = 4
MAX_MODEL_LEN = 1024
TOLERANCE = 0.05
# Cosine bars, each calibrated on a measured run (2026-11-30) and set below it with margin:
# - CPU, the reference's call pattern (batched / ZOS / preemption / abort): same ops, one-ulp row-count effects
#   only; measured >= 0.99925 with torch.topk's tie order, 0.99653 since top-k ties go to the lowest position
#   (mini_flashmla.reference.topk_lowest_index; each request alone is still within 1e-6): the 3-row batch's
#   one-ulp rounding now tips a different near-tied index score at the 260-token prompt's last decode step.
MIN_COSINE = 0.995
# - chunked prefill: the reference itself, prefilling 128 instead of 260 tokens, already differs from layer 2 on
#   (cosine 0.965 at isolated positions of the last layer: bf16-tied indexer scores flip a top-k entry, FP4/FP8
#   requantization amplifies last-bit differences; docs/MODEL.md). The engine's chunked prefill inherits exactly
#   that; measured 0.989-0.992 batched, 0.974 for the 260-token prompt alone. A wrong ring row, carry or block
#   table gives far less (the fake-model tests in runtime/tests/test_engine.py check those paths exactly).
MIN_COSINE_CHUNKED = 0.95
# - CUDA: the engine runs its FP8/FP4 linears through mini-deepgemm's Triton kernels and attention through
#   mini-flashmla's, the reference through torch; other accumulation orders, amplified by the random tiny model
#   (one extra bf16 rounding in the MoE alone moves its logits by up to 1.3). Measured on H200: 0.969 batched,
#   0.924 with preemption (greedy tokens equal up to the near-tie rule in both).
MIN_COSINE_CUDA = 0.9
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    from mini_deepinfer.models.deepseek_v41 import load_model, load_reference
    from mini_deepinfer.models.deepseek_v41.cache import V41Cache

    model = load_model("tiny-random/deepseek-v4.1-flash-1017", DEVICE)
    g = torch.Generator().manual_seed(1017)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
    return dict(
        config=model.config,
        model=model,
        reference=load_reference("tiny-random/deepseek-v4.1-flash-1017", DEVICE),
        cache_cls=V41Cache,
        prompts=prompts,
        ref_cache={},
    )


def reference_logits(tiny, prompt: list[int], tokens: list[int], recomputed: set[int]) -> list[torch.Tensor]:
    """The reference's logits for each output position, on the engine's execution path and tokens.

    Output k in `recomputed` was sampled by the engine at the end of a prefill of prompt + outputs[:k] (a
    recomputation after preemption), and the outputs after it by decode steps from that state; the reference
    follows the same path (its prefill and its decode of the same tokens differ: see the module docstring).
    Memoized per (prompt, forced tokens, recomputed positions).
    """
    key = (tuple(prompt), tuple(tokens[:-1]), tuple(sorted(recomputed)))
    if key not in tiny["ref_cache"]:
        ref = tiny["reference"]
        logits = []
        for k in range(len(tokens)):
            if k == 0 or k in recomputed:
                state = ref.new_state()
                row = ref.forward(torch.tensor(prompt + tokens[:k]), 0, state)[-1]
            else:
                row = ref.forward(torch.tensor([tokens[k - 1]]), len(prompt) + k - 1, state)[-1]
            logits.append(row.float().cpu())
        tiny["ref_cache"][key] = logits
    return tiny["ref_cache"][key]


def run_engine(tiny, num_blocks: int | None = None, abort: tuple[str, int] | None = None,
               max_model_len: int = MAX_MODEL_LEN, **config_kw):
    cache_cls = tiny["cache_cls"]
    max_num_seqs = 4
    budget = None
    if num_blocks is not None:
        budget = (num_blocks * cache_cls.bytes_per_block(tiny["config"])
                  + (max_num_seqs + 1) * cache_cls.bytes_per_slot(tiny["config"])) / 2**30
    config = EngineConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs, record_logits=True,
                          kv_cache_memory_gb=budget if budget is not None else 0.25, **config_kw)
    engine = LLMEngine(tiny["model"], cache_cls, config, DEVICE)
    engine.recomputed = {}  # request id -> output positions sampled at the end of a recomputation (a prefill)
    execute = engine.runner.execute

    def recording_execute(step, prev):
        for s in step.sampled:
            if step.is_prefill and s.sample_position > 0:
                engine.recomputed.setdefault(s.seq.request_id, set()).add(s.sample_position)
        return execute(step, prev)

    engine.runner.execute = recording_execute
    for i, prompt in enumerate(tiny["prompts"]):
        engine.add_request(prompt, GREEDY, request_id=f"r{i}")
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        if abort is not None and engine.num_steps == abort[1]:
            engine.abort_request(abort[0])
    assert engine.scheduler.kv.all_free()
    return engine, outputs


def compare(tiny, engine, outputs, mode: str, strict: bool) -> None:
    """strict: logits within TOLERANCE (CPU only); otherwise cosine >= the bar of the mode and device (above)."""
    worst, worst_cos = 0.0, 1.0
    for i, prompt in enumerate(tiny["prompts"]):
        out = outputs[f"r{i}"]
        if not out.token_ids:
            continue
        ref = reference_logits(tiny, prompt, out.token_ids, engine.recomputed.get(f"r{i}", set()))
        near_tie = False
        for j, (got, want) in enumerate(zip(out.logits, ref)):
            got = got.float().cpu()
            diff = float((got - want).abs().max())
            cos = float(torch.nn.functional.cosine_similarity(got, want, dim=0))
            worst, worst_cos = max(worst, diff), min(worst_cos, cos)
            top2 = want.topk(2).values
            near_tie = near_tie or float(top2[0] - top2[1]) < max(TOLERANCE, 2 * diff)
            if not near_tie:
                assert out.token_ids[j] == int(want.argmax()), f"{mode}: r{i} token {j}"
    print(f"\n[engine vs reference] {mode} on {DEVICE}: max |logits diff| = {worst:.3g}, min cosine = "
          f"{worst_cos:.6f} (prompts {[len(p) for p in tiny['prompts']]})")
    chunked = any(c in mode for c in CHUNKED)
    if strict and DEVICE == "cpu" and not chunked:
        assert worst < TOLERANCE, f"{mode}: max logits diff {worst}"
    bar = MIN_COSINE_CUDA if DEVICE == "cuda" else MIN_COSINE_CHUNKED if chunked else MIN_COSINE
    assert worst_cos >= bar, f"{mode}: logits cosine {worst_cos} < {bar}"


MODES = {
    "batched_zos_on": dict(enable_zos=True),
    "batched_zos_off": dict(enable_zos=False),
    "chunked_128": dict(max_num_batched_tokens=128),
    "chunked_200_zos_off": dict(max_num_batched_tokens=200, enable_zos=False),
}
CHUNKED = {"chunked_128", "chunked_200_zos_off"}


@pytest.mark.parametrize("mode", list(MODES))
def test_engine_matches_reference(tiny, mode):
    engine, outputs = run_engine(tiny, **MODES[mode])
    assert all(o.finish_reason == "length" and len(o.token_ids) == MAX_TOKENS for o in outputs.values())
    compare(tiny, engine, outputs, mode, strict=False)


@pytest.mark.parametrize("mode", ["batched_zos_on", "chunked_128"])
def test_each_request_alone_matches_reference_within_tolerance(tiny, mode):
    for prompt in tiny["prompts"]:
        alone = dict(tiny, prompts=[prompt])
        engine, outputs = run_engine(alone, **MODES[mode])
        compare(alone, engine, outputs, f"{mode}_alone", strict=True)


@pytest.mark.parametrize("zos", [True, False])
def test_forced_preemption_and_recompute_match_reference(tiny, zos):
    # blocks for the prompts at admission and nothing more: the 126-token prompt needs a second block on its
    # third decode step, so a sequence with outputs is preempted and later recomputed (prompt + outputs)
    at_admission = sum(-(-n // 128) for n in PROMPT_LENS)
    engine, outputs = run_engine(tiny, num_blocks=at_admission + 1, enable_zos=zos, prefill_attempt_interval=1,
                                 max_model_len=128 * at_admission)  # the budget check needs one such sequence
    assert engine.scheduler.num_preemptions > 0
    assert all(len(o.token_ids) == MAX_TOKENS for o in outputs.values())
    assert engine.recomputed, "no sequence with outputs was recomputed"
    compare(tiny, engine, outputs, f"preemption_zos_{'on' if zos else 'off'}", strict=False)


def test_abort_of_one_request_leaves_the_others_matching(tiny):
    engine, outputs = run_engine(tiny, abort=("r1", 2))
    assert outputs["r1"].finish_reason == "abort" and len(outputs["r1"].token_ids) < MAX_TOKENS
    assert all(outputs[f"r{i}"].finish_reason == "length" for i in range(len(PROMPT_LENS)) if i != 1)
    compare(tiny, engine, outputs, "abort_one", strict=False)
