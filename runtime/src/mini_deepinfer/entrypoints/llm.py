"""Offline batch generation: `LLM(model).generate(prompts, sampling_params)`, prompts as text or token ids."""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from mini_deepinfer.engine.block_manager import BLOCK_SIZE
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine, RequestOutput, check_request
from mini_deepinfer.engine.scheduler import DEFAULT_MAX_NUM_SEQS
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.models.deepseek_v41.checkpoint import CONFIG_FILE, TOKENIZER_FILE
from mini_deepinfer.worker.model_runner import CacheType, check_weights_fit

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CPU_DEFAULT_KV_GB = 1.0  # there is no "free device memory" to take a fraction of on CPU


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The checkpoint's `tokenizers.Tokenizer`, or None when the folder has no tokenizer.json (the `tokenizers`
    package is imported only then, so a checkpoint without a tokenizer does not need it)."""
    path = folder / TOKENIZER_FILE
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


class LLM:
    """A model plus an engine (or one engine per rank), for offline generation.

    model: a checkpoint folder or a known name ("tiny-random/deepseek-v4.1-flash-1017" is generated locally on first
        use; nothing is downloaded), or an already built model module together with its `cache_cls`. A folder
        with a `tokenizer.json` gives text in (`generate(["..."])`) and out (`RequestOutput.text`).
    kv_cache_memory_gb | gpu_memory_utilization: the cache budget, absolute or as a fraction of free CUDA memory
        (default: 0.9 of free memory on CUDA, 1 GiB on CPU); per rank with data parallelism.
    device: "cuda" when available, else "cpu", unless given.
    data_parallel_size: N > 1 runs generate() on N processes (distributed/data_parallel.py: EP x DP, one GPU each
        on CUDA, gloo processes on CPU), prompt i on rank i % N; model must then be a folder or name.
    exact_moe: with N > 1, add the routed expert outputs in the single-process order (num_topk combines per MoE
        layer): the outputs are then those of data_parallel_size=1; without it, one weighted combine whose extra
        bf16 roundings can change tokens of the tiny random model.
    enforce_eager: run decode steps eagerly instead of replaying CUDA graphs (CUDA only; worker/cuda_graphs.py).
    The remaining options are EngineConfig's.
    """

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        max_model_len: int = 4096,
        kv_cache_memory_gb: float | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int | None = None,
        chunked_prefill: bool = True,
        prefill_attempt_interval: int = 70,
        enable_zos: bool = True,
        device: str | torch.device | None = None,
        cache_cls: type[CacheType] | None = None,
        record_logits: bool = False,
        data_parallel_size: int = 1,
        exact_moe: bool = False,
        enforce_eager: bool = False,
    ) -> None:
        device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cpu" and kv_cache_memory_gb is None and gpu_memory_utilization is None:
            kv_cache_memory_gb = CPU_DEFAULT_KV_GB
        config = EngineConfig(
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            chunked_prefill=chunked_prefill,
            prefill_attempt_interval=prefill_attempt_interval,
            enable_zos=enable_zos,
            kv_cache_memory_gb=kv_cache_memory_gb,
            gpu_memory_utilization=gpu_memory_utilization,
            record_logits=record_logits,
            enforce_eager=enforce_eager,
        )
        config.scheduler_config()  # bad limits fail here, before a checkpoint is loaded
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        self.config, self.device = config, device
        self.data_parallel_size, self.exact_moe = data_parallel_size, exact_moe
        self.engine: LLMEngine | None = None  # None with data parallelism: each rank builds its own
        self.tokenizer = None
        if isinstance(model, torch.nn.Module):
            if data_parallel_size > 1:
                raise ValueError("data_parallel_size > 1 needs a checkpoint folder or name (each rank loads its shard)")
            if cache_cls is None:
                raise ValueError("a model module needs its cache class: LLM(model, cache_cls=...)")
            self.model_config = model.config
            self.engine = LLMEngine(model, cache_cls, config, device)
            return
        from mini_deepinfer.models.deepseek_v41 import load_model, resolve_checkpoint
        from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE as V41_BLOCK_SIZE
        from mini_deepinfer.models.deepseek_v41.cache import V41Cache
        from mini_deepinfer.models.deepseek_v41.config import V41Config

        if V41_BLOCK_SIZE != BLOCK_SIZE:
            raise RuntimeError(f"the V4.1 cache uses {V41_BLOCK_SIZE}-token blocks, the engine {BLOCK_SIZE}")
        self.folder = resolve_checkpoint(model)
        self.tokenizer = load_tokenizer(self.folder)
        if data_parallel_size > 1:
            if device.type == "cuda" and torch.cuda.device_count() < data_parallel_size:
                raise ValueError(f"data_parallel_size={data_parallel_size} needs one GPU per rank, "
                                 f"{torch.cuda.device_count()} visible")
            self.model_config = V41Config.from_json(self.folder / CONFIG_FILE)
            return
        check_weights_fit(self.folder, device)
        model = load_model(self.folder, device)
        self.model_config = model.config
        self.engine = LLMEngine(model, V41Cache, config, device)

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        prompts: texts (encoded with the checkpoint's tokenizer) or token-id lists; or pass prompt_token_ids.
        sampling_params: one for all prompts, or a list with one per prompt (default: SamplingParams()).
        Every prompt is checked before any is queued, so a bad one raises ValueError and changes nothing.
        Each output's `.text` is its generated tokens decoded (special tokens skipped), None without a tokenizer.
        With data_parallel_size > 1 there is no progress bar (the ranks report at the end).
        """
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass either prompts or prompt_token_ids")
        if isinstance(prompts, str):
            raise TypeError("prompts is a list: generate([text]), not generate(text)")
        token_ids = [self._encode(p) for p in prompts] if prompts is not None else list(prompt_token_ids)
        if token_ids and all(isinstance(p, numbers.Integral) or isinstance(p, torch.Tensor) and p.dim() == 0
                             for p in token_ids):  # one prompt's ids, not wrapped in a list
            raise TypeError("prompts is a list of prompts: generate([[5, 6, 7]]), not generate([5, 6, 7])")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(token_ids)
        else:
            params = list(sampling_params)
            if len(params) != len(token_ids):
                raise ValueError(f"{len(params)} sampling params for {len(token_ids)} prompts")
        checked = [check_request(p, sp, self.model_config.vocab_size, self.config.max_model_len)
                   for p, sp in zip(token_ids, params)]
        if self.engine is None:
            from mini_deepinfer.distributed.data_parallel import generate_data_parallel

            outputs = generate_data_parallel(str(self.folder), checked, params, self.data_parallel_size,
                                             self.device.type, self.exact_moe, **dataclasses.asdict(self.config))
        else:
            outputs = self._run_engine(checked, params, use_tqdm)
        if self.tokenizer is not None:
            for out in outputs:
                out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return outputs

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if not isinstance(prompt, str):
            return prompt
        if self.tokenizer is None:
            raise ValueError(f"a text prompt needs a tokenizer, and the checkpoint has no {TOKENIZER_FILE}: "
                             "pass token ids instead")
        return self.tokenizer.encode(prompt).ids

    def _run_engine(self, prompts: list[list[int]], params: list[SamplingParams], use_tqdm: bool
                    ) -> list[RequestOutput]:
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        wanted = set(ids)
        results: dict[str, RequestOutput] = {}
        start, generated = time.perf_counter(), 0
        with tqdm(total=len(ids), desc="Generating", disable=not use_tqdm, unit="req") as bar:
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.request_id in wanted:
                        results[out.request_id] = out
                        generated += len(out.token_ids)
                        bar.update(1)
                        bar.set_postfix(output_tok_s=f"{generated / (time.perf_counter() - start):.1f}")
        return [results[i] for i in ids]
