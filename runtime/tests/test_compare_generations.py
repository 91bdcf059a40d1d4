"""engine.testing.compare_generations, the checker of the multi-GPU comparisons (DP vs one GPU), on made-up outputs:
it must pass equal runs and near-tie flips, and fail logits beyond atol and greedy flips at a clear margin (the GPU
tests that use it cannot show that it fails when it should)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.testing import compare_generations

ATOL = 0.01
GREEDY = SamplingParams(temperature=0.0, max_tokens=3)
SAMPLED = SamplingParams(temperature=0.8, max_tokens=3, seq_seed=1)


def output(tokens: list[int], logits: list[list[float]]) -> SimpleNamespace:
    return SimpleNamespace(token_ids=tokens, logits=[torch.tensor(row) for row in logits])


WANT = output([0, 1, 0], [[1.0, 0.0, -1.0], [0.0, 1.0, 0.5], [2.0, 1.0, 0.0]])


def test_equal_runs_pass_and_the_largest_difference_is_returned() -> None:
    got = output([0, 1, 0], [[1.0, 0.0, -1.0], [0.0, 1.005, 0.5], [2.0, 1.0, 0.0]])
    assert compare_generations([got], [WANT], [GREEDY], ATOL) == pytest.approx(0.005)


def test_logits_beyond_atol_fail() -> None:
    got = output([0, 1, 0], [[1.0, 0.0, -1.0], [0.0, 1.02, 0.5], [2.0, 1.0, 0.0]])
    with pytest.raises(AssertionError, match="step 1: logits differ"):
        compare_generations([got], [WANT], [GREEDY], ATOL)


def test_a_greedy_flip_is_allowed_only_at_a_near_tie() -> None:
    near_tie = output([0, 1], [[1.0, 0.0], [0.995, 1.0]])
    flipped = output([0, 0, 7], [[1.0, 0.0], [1.0, 0.995], [9.0, 0.0]])  # later steps differ: not compared
    compare_generations([flipped], [near_tie], [GREEDY], ATOL)
    clear = output([0, 1], [[1.0, 0.0], [0.5, 1.0]])
    with pytest.raises(AssertionError, match="greedy tokens differ"):
        compare_generations([output([0, 0], [[1.0, 0.0], [0.5, 1.0]])], [clear], [GREEDY], ATOL)


def test_a_sampled_request_may_diverge_where_the_logits_agree() -> None:
    got = output([0, 2, 5], [[1.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.0, 0.0, 9.0]])
    compare_generations([got], [WANT], [SAMPLED], ATOL)
