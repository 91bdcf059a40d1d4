"""Single-process checks of the routing layout against plain loops (exact: integer outputs), and of the
layout kernels against the torch path (GPU; also on CPU under TRITON_INTERPRET=1, which CI does not run)."""

import os

import pytest
import torch

from mini_deepep.layout import get_dispatch_layout, get_dispatch_layout_torch, local_expert_ids, plan_expert_segments
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


# The layout kernels run on CUDA, or on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, slow).
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def _routing(kind: str, num_tokens: int, num_topk: int, num_experts: int, num_ranks: int, seed: int) -> torch.Tensor:
    """int64 [T, K] expert ids, distinct per token, with -1 entries and whole rows of -1 at random.

    kind "one_rank": every expert on rank 0 (the other ranks receive nothing); "duplicates": some tokens list an
    expert twice (not a valid routing; the kernels count it once, as the torch path does)."""
    g = torch.Generator().manual_seed(seed)
    pool = num_experts // num_ranks if kind == "one_rank" else num_experts
    idx = torch.rand(num_tokens, pool, generator=g).argsort(dim=1)[:, :num_topk]
    idx[torch.rand(num_tokens, num_topk, generator=g) < 0.1] = -1
    idx[torch.rand(num_tokens, generator=g) < 0.05] = -1
    if kind == "duplicates" and num_topk > 1:
        twice = torch.rand(num_tokens, generator=g) < 0.2
        idx[twice, -1] = idx[twice, 0]
    return idx


# (kind, T, K, E, R). K, E and R are compile-time constants of the kernels (one compile per combination, ~1 s on
# the GPU machine), so the small cases cover K = 1, 5, 8 and three (E, R) at three T; the three forms of topk_idx
# are checked on a few of them; large ones as contiguous int64 only (under the interpreter T=16384 takes minutes).
SMALL_CASES = [
    *[("random", t, k, e, r) for t in (1, 7, 97) for k in (1, 5, 8) for e, r in ((8, 1), (16, 2), (384, 8))],
    *[("random", t, 6, e, r) for t in (0, 33) for e, r in ((384, 2), (1024, 4), (1024, 8))],
    ("one_rank", 97, 6, 384, 8), ("duplicates", 97, 6, 384, 8),
]
FORM_CASES = [("random", 97, k, 384, 8) for k in (1, 6)] + [("random", 7, 3, 16, 2)]
LARGE_CASES = [
    *[("random", 4095, 6, e, r) for e, r in ((384, 2), (1024, 4), (1024, 8))],
    ("random", 4096, 6, 384, 2), ("random", 4096, 6, 384, 8), ("random", 16384, 8, 1024, 8),
    ("one_rank", 4096, 6, 384, 2), ("duplicates", 4096, 8, 64, 4),
]
FORMS = ("int64", "int32", "strided")  # strided: an int64 column slice of a wider tensor


@pytest.mark.gpu
@pytest.mark.skipif(not KERNELS_RUN, reason="needs CUDA (or TRITON_INTERPRET=1)")
@pytest.mark.parametrize(
    ("case", "form"),
    [(c, "int64") for c in SMALL_CASES + LARGE_CASES] + [(c, f) for c in FORM_CASES for f in FORMS if f != "int64"],
    ids=lambda v: "{}-T{}-K{}-E{}-R{}".format(*v) if isinstance(v, tuple) else v,
)
def test_layout_kernels_match_torch(case: tuple[str, int, int, int, int], form: str) -> None:
    dispatch_layout = pytest.importorskip("mini_deepep.kernels.layout").dispatch_layout
    kind, num_tokens, num_topk, num_experts, num_ranks = case
    idx = _routing(kind, num_tokens, num_topk, num_experts, num_ranks, seed=num_tokens * num_topk + num_ranks)
    idx = idx.to(device=KERNEL_DEVICE, dtype=torch.int32 if form == "int32" else torch.int64)
    if form == "strided":
        wide = torch.full((num_tokens, num_topk + 3), -1, dtype=idx.dtype, device=KERNEL_DEVICE)
        wide[:, 1:num_topk + 1] = idx
        idx = wide[:, 1:num_topk + 1]
    got = dispatch_layout(idx, num_experts, num_ranks)
    for name, value, ref in zip(got._fields, got, get_dispatch_layout_torch(idx, num_experts, num_ranks)):
        assert value.dtype == ref.dtype and value.shape == ref.shape, name
        assert torch.equal(value, ref), f"{name} differs ({case}, {form})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_layout_kernels_replay_in_cuda_graph() -> None:
    """No host sync and fixed shapes: a captured layout recomputes correctly for new routings."""
    idx = _routing("random", 4096, 6, 384, 8, seed=1).cuda()
    get_dispatch_layout(idx, 384, 8)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = get_dispatch_layout(idx, 384, 8)
    for seed in (2, 3):
        idx.copy_(_routing("random", 4096, 6, 384, 8, seed=seed))
        graph.replay()
        for name, value, ref in zip(captured._fields, captured, get_dispatch_layout_torch(idx, 384, 8)):
            assert torch.equal(value, ref), name
