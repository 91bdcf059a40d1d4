"""DeepSeek-V4.1: config, checkpoint format, the sequential reference and the engine's batched model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mini_deepinfer.models.deepseek_v41.checkpoint import TOKENIZER_FILE, load_checkpoint, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.config import V41Config
from mini_deepinfer.models.deepseek_v41.engram import compressed_token_map

if TYPE_CHECKING:
    from mini_deepinfer.models.deepseek_v41.model import V41Model
    from mini_deepinfer.models.deepseek_v41.reference import ReferenceV41


def load_token_map(folder: Path, config: V41Config) -> torch.Tensor:
    """Engram's compressed token map from the checkpoint's tokenizer.json, else the documented fallback."""
    tok = folder / TOKENIZER_FILE
    return compressed_token_map(config, tok if tok.exists() else None)


def _load(model_cls: type, name_or_path: str | Path, device: str | torch.device, config_overrides: dict | None):
    """model_cls(config, weights, device, token_map=...) built from the checkpoint (V41Model or ReferenceV41)."""
    folder = resolve_checkpoint(name_or_path)
    # read into host memory; the model moves each tensor to `device` itself. The engine model stacks the routed
    # experts first, so the device never holds them twice (per expert and stacked)
    config, weights = load_checkpoint(folder, "cpu")
    if config_overrides:
        config = dataclasses.replace(config, **config_overrides)
    return model_cls(config, weights, device, token_map=load_token_map(folder, config))


def load_model(
    name_or_path: str | Path, device: str | torch.device = "cpu", config_overrides: dict | None = None
) -> V41Model:
    """Resolve, validate and load a checkpoint into the engine's V41Model (weights kept in their stored formats).

    config_overrides: dataclass fields to replace after loading (e.g. {"index_k_reference_quirk": False}).
    """
    from mini_deepinfer.models.deepseek_v41.model import V41Model

    return _load(V41Model, name_or_path, device, config_overrides)


def load_reference(
    name_or_path: str | Path, device: str | torch.device = "cpu", config_overrides: dict | None = None
) -> ReferenceV41:
    """The same checkpoint in the sequential reference model (the oracle)."""
    from mini_deepinfer.models.deepseek_v41.reference import ReferenceV41

    return _load(ReferenceV41, name_or_path, device, config_overrides)
