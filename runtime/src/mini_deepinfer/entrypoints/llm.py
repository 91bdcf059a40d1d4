"""Offline batch generation: `LLM(model).generate(prompt_token_ids, sampling_params)`."""

from __future__ import annotations

import os
import time

import torch
from tqdm import tqdm

from mini_deepinfer.engine.block_manager import BLOCK_SIZE
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine, RequestOutput
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.worker.model_runner import CacheType

CPU_DEFAULT_KV_GB = 1.0  # there is no "free device memory" to take a fraction of on CPU


class LLM:
    """A model plus an engine, for offline generation.

    model: a checkpoint folder or a known name ("tiny-random/deepseek-v4.1-flash-1017" is generated locally on first
        use; nothing is downloaded), or an already built model module together with its `cache_cls`.
    kv_cache_memory_gb | gpu_memory_utilization: the cache budget, absolute or as a fraction of free CUDA memory
        (default: 0.9 of free memory on CUDA, 1 GiB on CPU).
    device: "cuda" when available, else "cpu", unless given.
    The remaining options are EngineConfig's.
    """

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        max_model_len: int = 4096,
        kv_cache_memory_gb: float | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int | None = None,
        chunked_prefill: bool = True,
        prefill_attempt_interval: int = 70,
        enable_zos: bool = True,
        device: str | torch.device | None = None,
        cache_cls: type[CacheType] | None = None,
        record_logits: bool = False,
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
        )
        config.scheduler_config()  # bad limits fail here, before a checkpoint is loaded
        if isinstance(model, torch.nn.Module):
            if cache_cls is None:
                raise ValueError("a model module needs its cache class: LLM(model, cache_cls=...)")
        else:
            from mini_deepinfer.models.deepseek_v41 import load_model
            from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE as V41_BLOCK_SIZE
            from mini_deepinfer.models.deepseek_v41.cache import V41Cache

            if V41_BLOCK_SIZE != BLOCK_SIZE:
                raise RuntimeError(f"the V4.1 cache uses {V41_BLOCK_SIZE}-token blocks, the engine {BLOCK_SIZE}")
            model, cache_cls = load_model(model, device), V41Cache
        self.engine = LLMEngine(model, cache_cls, config, device)

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        sampling_params: one for all prompts, or a list with one per prompt (default: SamplingParams()).
        Every prompt is checked before any is queued, so a bad one raises ValueError and changes nothing.
        """
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompt_token_ids)
        else:
            params = list(sampling_params)
            if len(params) != len(prompt_token_ids):
                raise ValueError(f"{len(params)} sampling params for {len(prompt_token_ids)} prompts")
        checked = [self.engine.check_request(p, sp) for p, sp in zip(prompt_token_ids, params)]
        ids = [self.engine.add_request(p, sp) for p, sp in zip(checked, params)]
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
