"""The KV budget (worker/model_runner.py): sized from kv_cache_memory_gb or gpu_memory_utilization x free CUDA
memory, and clear errors naming the numbers when one max_model_len sequence or the model's weights do not fit.
CUDA memory queries are replaced by fixed numbers, so these run on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mini_deepinfer.engine.block_manager import blocks_for
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.config import tiny_config
from mini_deepinfer.worker.model_runner import check_weights_fit, plan_cache

GIB = 2**30
CFG = tiny_config()


def fake_cuda_memory(monkeypatch, free: int, total: int = 80 * GIB) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))


def test_budget_from_gpu_memory_utilization(monkeypatch):
    fake_cuda_memory(monkeypatch, free=10 * GIB)
    plan = plan_cache(CFG, V41Cache, max_num_seqs=4, max_model_len=1000, device=torch.device("cuda"),
                      kv_cache_memory_gb=None, gpu_memory_utilization=0.5)
    assert plan.num_slots == 5
    assert plan.num_blocks == 4 * blocks_for(1000) + 1  # capped at what 4 full-length sequences use
    assert plan.bytes <= 5 * GIB


def test_budget_blocks_fill_what_is_left_after_the_slots(monkeypatch):
    slot, block = V41Cache.bytes_per_slot(CFG), V41Cache.bytes_per_block(CFG)
    budget = 5 * slot + 40 * block + block // 2
    plan = plan_cache(CFG, V41Cache, max_num_seqs=4, max_model_len=20 * 128, device=torch.device("cpu"),
                      kv_cache_memory_gb=budget / GIB, gpu_memory_utilization=None)
    assert (plan.num_slots, plan.num_blocks) == (5, 40)  # one 20-block sequence fits, four would not
    assert plan.bytes == 5 * slot + 40 * block <= budget


def test_window_only_models_take_every_block_they_could_use():
    """Blocks hold only the compressed layers' state, so a model of window-only layers has 0-byte blocks: the plan
    takes the most blocks its sequences could use (it divided by zero before session 79)."""
    window_only = dataclasses.replace(CFG, num_hidden_layers=2, kv_source_layer_ids=(), index_source_layer_ids=(),
                                      candidate_source_layer_id=None)
    window_only.validate()
    assert V41Cache.bytes_per_block(window_only) == 0
    slot = V41Cache.bytes_per_slot(window_only)
    plan = plan_cache(window_only, V41Cache, max_num_seqs=4, max_model_len=1000, device=torch.device("cpu"),
                      kv_cache_memory_gb=5 * slot / GIB, gpu_memory_utilization=None)
    assert (plan.num_slots, plan.num_blocks, plan.bytes) == (5, 4 * blocks_for(1000) + 1, 5 * slot)
    with pytest.raises(ValueError, match="is too small"):  # the slots alone do not fit
        plan_cache(window_only, V41Cache, max_num_seqs=4, max_model_len=1000, device=torch.device("cpu"),
                   kv_cache_memory_gb=4 * slot / GIB, gpu_memory_utilization=None)


def test_too_small_for_one_sequence_names_the_numbers(monkeypatch):
    fake_cuda_memory(monkeypatch, free=GIB // 1000)
    with pytest.raises(ValueError) as err:
        plan_cache(CFG, V41Cache, max_num_seqs=4, max_model_len=65536, device=torch.device("cuda"),
                   kv_cache_memory_gb=None, gpu_memory_utilization=0.9)
    msg = str(err.value)
    assert "gpu_memory_utilization=0.9" in msg and "GiB free of 80.00 GiB" in msg
    assert f"{blocks_for(65536)} blocks of {V41Cache.bytes_per_block(CFG)} B" in msg
    assert f"5 state slots of {V41Cache.bytes_per_slot(CFG)} B" in msg
    with pytest.raises(ValueError, match=r"\(kv_cache_memory_gb\) is too small"):
        plan_cache(CFG, V41Cache, max_num_seqs=4, max_model_len=65536, device=torch.device("cpu"),
                   kv_cache_memory_gb=1e-4, gpu_memory_utilization=None)


def test_weights_that_do_not_fit_are_refused_before_loading(monkeypatch, tmp_path):
    with open(tmp_path / "model-00001-of-00002.safetensors", "wb") as f:
        f.truncate(3 * GIB)  # sparse: no disk used
    with open(tmp_path / "model-00002-of-00002.safetensors", "wb") as f:
        f.truncate(GIB)
    fake_cuda_memory(monkeypatch, free=2 * GIB)
    with pytest.raises(ValueError, match=r"does not fit: its weights need 4\.00 GiB, cuda has 2\.00 GiB free of 80"):
        check_weights_fit(tmp_path, torch.device("cuda"))
    fake_cuda_memory(monkeypatch, free=5 * GIB)
    assert check_weights_fit(tmp_path, torch.device("cuda")) == 4 * GIB
    assert check_weights_fit(tmp_path, torch.device("cpu")) == 4 * GIB  # CPU: no check
