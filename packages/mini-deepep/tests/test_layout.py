"""Single-process checks of the routing layout against plain loops (exact: integer outputs)."""

import pytest
import torch

from mini_deepep.layout import get_dispatch_layout, local_expert_ids, plan_expert_segments
from mini_deepep.reference import reference_receive
from mini_deepep.testing import Scenario, make_inputs


@pytest.mark.parametrize("num_ranks", [1, 2, 4])
@pytest.mark.parametrize("num_tokens", [0, 1, 77, 300])
def test_get_dispatch_layout_matches_loops(num_ranks: int, num_tokens: int) -> None:
    scenario = Scenario("layout", (num_tokens,) * num_ranks, seed=num_tokens)
    _, topk, _ = make_inputs(scenario, num_ranks - 1, num_ranks)
    num_experts, per_rank = scenario.num_experts, scenario.num_experts // num_ranks
    layout = get_dispatch_layout(topk, num_experts, num_ranks)

    in_rank = torch.zeros(num_tokens, num_ranks, dtype=torch.bool)
    per_expert = torch.zeros(num_experts, dtype=torch.int32)
    rank_in_expert = torch.full_like(topk, -1, dtype=torch.int32)
    for t, row in enumerate(topk.tolist()):
        for k, e in enumerate(row):
            if e >= 0:
                in_rank[t, e // per_rank] = True
                rank_in_expert[t, k] = per_expert[e]
                per_expert[e] += 1
    send_slot = torch.full((num_tokens, num_ranks), -1, dtype=torch.int32)
    for r in range(num_ranks):
        send_slot[in_rank[:, r], r] = torch.arange(int(in_rank[:, r].sum()), dtype=torch.int32)

    assert torch.equal(layout.is_token_in_rank, in_rank)
    assert torch.equal(layout.num_tokens_per_rank, in_rank.sum(0, dtype=torch.int32))
    assert torch.equal(layout.num_tokens_per_expert, per_expert)
    assert torch.equal(layout.rank_in_expert, rank_in_expert)
    assert torch.equal(layout.send_slot, send_slot)


@pytest.mark.parametrize("m_alignment", [1, 8, 128])
@pytest.mark.parametrize("tokens", [(0, 0), (0, 50), (97, 203)])
def test_plan_expert_segments_matches_reference(m_alignment: int, tokens: tuple[int, int]) -> None:
    scenario = Scenario("plan", tokens, seed=sum(tokens) + m_alignment)
    topks = [make_inputs(scenario, r, 2)[1] for r in range(2)]
    for rank in range(2):
        # Received tokens in (source rank, token) order, as both backends deliver them.
        recv = [local_expert_ids(topk, rank, 192) for topk in topks]
        recv_ids = torch.cat([ids[(ids >= 0).any(1)] for ids in recv])
        seg = plan_expert_segments(recv_ids, 192, m_alignment)
        ref = reference_receive(topks, rank, scenario.num_experts, m_alignment)
        assert torch.equal(seg.grouped_layout, ref.grouped_layout)
        assert torch.equal(seg.num_tokens_per_expert, ref.num_tokens_per_expert)
        assert int(seg.num_rows) == ref.grouped_layout.numel()
        # Every (received token, k) lands on its reference row.
        valid = seg.positions >= 0
        assert int(valid.sum()) == len(ref.rows)
        rows = sorted(seg.positions[valid].tolist())
        assert rows == sorted(ref.rows)


def test_plan_fixed_rows_drops_overflow_and_pads() -> None:
    ids = torch.tensor([[0, 1], [1, -1], [0, -1]], dtype=torch.int32)
    seg = plan_expert_segments(ids, 2, 4, num_rows=5)  # needs 8 rows: expert 1's second row is dropped
    assert seg.grouped_layout.tolist() == [0, 0, -1, -1, 1]
    assert seg.positions.tolist() == [[0, 4], [-1, -1], [1, -1]]
    assert int(seg.num_rows) == 8
