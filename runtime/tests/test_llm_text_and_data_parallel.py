"""LLM's text in and out (a checkpoint folder with a tokenizer.json) and LLM(..., data_parallel_size=2), on CPU
ranks (gloo) and on 2 GPUs.

The test tokenizer is a word-level one covering the tiny model's whole vocabulary, so every generated id decodes
to a word and `.text` can be checked exactly: id 0 is "<bos>" (prepended by the post-processor, like DeepSeek's),
1 "<eos>", 2 "<unk>"; ids below half the vocabulary are "t{id}", the rest "T{id - half}". Upper and lower case
fold to one Engram key (engram.compressed_token_map), which keeps the number of compressed ids (about V / 2)
within the tiny config's engram_compressed_vocab_size, so the model loads with the tokenizer's Engram map.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mini_deepinfer import LLM, SamplingParams
from mini_deepinfer.distributed.testing import LOGITS_ATOL
from mini_deepinfer.engine.testing import FakeConfig, FakePagedCache, FakePagedModel, compare_generations
from mini_deepinfer.models.deepseek_v41 import resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.config import tiny_config

tokenizers = pytest.importorskip("tokenizers")

VOCAB = tiny_config().vocab_size
HALF = (VOCAB + 1) // 2
SPECIAL = ("<bos>", "<eos>", "<unk>")
ENGINE = {"max_model_len": 256, "max_num_seqs": 4, "kv_cache_memory_gb": 0.05, "device": "cpu"}
TEXTS = ["t5 T3 t99 t1000", "t42 " * 30 + "T64000", "T7"]


def word(token_id: int) -> str:
    if token_id < len(SPECIAL):
        return SPECIAL[token_id]
    return f"t{token_id}" if token_id < HALF else f"T{token_id - HALF}"


def build_tokenizer() -> "tokenizers.Tokenizer":
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({word(i): i for i in range(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL))
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    return tok


@pytest.fixture(scope="module")
def checkpoint_with_tokenizer(tmp_path_factory) -> Path:
    """The tiny checkpoint's files (the weights shard linked, not copied) plus tokenizer.json."""
    tiny, folder = resolve_checkpoint("tiny"), tmp_path_factory.mktemp("tiny-with-tokenizer")
    for f in tiny.iterdir():
        if f.suffix == ".safetensors":
            (folder / f.name).symlink_to(f)
        else:
            shutil.copy(f, folder / f.name)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def expected_text(token_ids: list[int]) -> str:
    return " ".join(word(i) for i in token_ids if i >= len(SPECIAL))


def test_text_prompts_give_the_same_tokens_as_their_ids_and_decoded_text(checkpoint_with_tokenizer) -> None:
    llm = LLM(checkpoint_with_tokenizer, **ENGINE)
    assert llm.engine.runner.model.token_map[HALF + 5] == llm.engine.runner.model.token_map[5]  # tokenizer's map
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=50, max_tokens=3, seq_seed=7, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=2, stop_token_ids=[1])]
    by_text = llm.generate(TEXTS, params, use_tqdm=False)
    ids = [[0, 5, HALF + 3, 99, 1000], [0] + [42] * 30 + [HALF + 64000], [0, HALF + 7]]
    by_ids = llm.generate(prompt_token_ids=ids, sampling_params=params, use_tqdm=False)
    for t, i, p in zip(by_text, by_ids, ids):
        assert t.prompt_token_ids == i.prompt_token_ids == p
        assert t.token_ids == i.token_ids and t.text == i.text == expected_text(t.token_ids)
    assert any(t.text for t in by_text)


def test_text_prompts_on_two_data_parallel_ranks(checkpoint_with_tokenizer) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=3, seq_seed=11, ignore_eos=True)
    dp = LLM(checkpoint_with_tokenizer, data_parallel_size=2, exact_moe=True, **ENGINE)
    assert dp.engine is None  # the ranks build their own engines
    two = dp.generate(TEXTS, params)
    one = LLM(checkpoint_with_tokenizer, **ENGINE).generate(TEXTS, params, use_tqdm=False)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert [o.text for o in two] == [o.text for o in one] == [expected_text(o.token_ids) for o in one]


def test_text_without_a_tokenizer_is_refused_and_outputs_have_no_text() -> None:
    llm = LLM(FakePagedModel(FakeConfig(vocab_size=512, eos_token_id=1)), cache_cls=FakePagedCache,
              max_model_len=256, kv_cache_memory_gb=0.001, max_num_seqs=4, device="cpu")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(TypeError, match="prompts is a list"):
        llm.generate("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="either prompts or prompt_token_ids"):
        llm.generate([[3, 4]], prompt_token_ids=[[3, 4]], use_tqdm=False)
    (out,) = llm.generate(prompt_token_ids=[[3, 4]], sampling_params=SamplingParams(max_tokens=2), use_tqdm=False)
    assert out.text is None and len(out.token_ids) >= 1
    assert llm.engine.scheduler.kv.all_free()


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_data_parallel_size_two_on_two_gpus_matches_one_gpu() -> None:
    """One rank per GPU (NCCL) against the single-GPU LLM, greedy and seeded requests. On CUDA the expert GEMMs
    see other row counts than in one process, so logits are not bit-identical: they must agree within LOGITS_ATOL,
    and the tokens wherever no near-tie allows a flip (engine.testing.compare_generations)."""
    engine = {**ENGINE, "device": "cuda", "kv_cache_memory_gb": 1.0, "record_logits": True}
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (150, 25, 40, 12)]
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=50, max_tokens=4, seq_seed=5, ignore_eos=True)] * 2
    two = LLM("tiny", data_parallel_size=2, exact_moe=True, **engine).generate(prompts, params)
    one = LLM("tiny", **engine).generate(prompts, params, use_tqdm=False)
    worst = compare_generations(two, one, params, LOGITS_ATOL)
    print(f"data_parallel_size=2 vs 1 GPU: logits max |diff| {worst:.4g}, tokens equal "
          f"{[o.token_ids for o in two] == [o.token_ids for o in one]}")
