"""mini-deepinfer: the runtime."""

from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.entrypoints.llm import LLM

__all__ = ["LLM", "SamplingParams"]
