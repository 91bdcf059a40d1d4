"""exp_flashmla_trace.step_cycles on a made-up trace (no GPU): each step is measured between the events the kernel
writes for it (sparse_attn_gluon_kernel's PAIR_EVENTS layout), so a change of the kernel's marks that the tool does
not follow shows here, not in device time."""

from __future__ import annotations

import torch
from exp_flashmla_trace import HEADER, LAST, PAIR_EVENTS, TRACE_EVENTS, TRACE_ROLES, WG0_STEPS, WG1_STEPS, step_cycles

PAIRS = 3
PAIR_PERIOD = 4000


def made_up_trace(programs: int) -> torch.Tensor:
    """Every program the same: block b handed over at 1,000 + 2,000 b (filled in 900), each consumer step a fixed
    number of cycles, wg0 past its wait for tile a 50 cycles after the hand-over, wg1 for tile b 70 after."""
    t = torch.zeros(programs, TRACE_ROLES, TRACE_EVENTS, dtype=torch.int64)
    t[:, HEADER, 1:5] = torch.tensor([0, 13_000, -10, 12_000])
    for b in range(2 * PAIRS):
        t[:, 2, 2 * b:2 * b + 2] = torch.tensor([100 + 2000 * b, 1000 + 2000 * b])
    for p in range(PAIRS):
        base = p * PAIR_EVENTS
        tile_a = 1050 + PAIR_PERIOD * p
        wg0 = [tile_a, tile_a + 1000, tile_a + 2000, tile_a + 2500, tile_a + 3500, tile_a + 3800]
        wg1 = [tile_a + 2300, 3070 + PAIR_PERIOD * p, tile_a + 3200, tile_a + 3400, tile_a + 3700]
        t[:, 0, base:base + len(wg0)] = torch.tensor(wg0)
        t[:, 1, base:base + len(wg1)] = torch.tensor(wg1)
    return t


def test_steps_follow_the_kernels_events() -> None:
    assert len(WG0_STEPS) == LAST[0] + 1 and len(WG1_STEPS) == LAST[1] + 1  # one step per event, the last one last
    rows = step_cycles(made_up_trace(3), 2 * PAIRS, torch.tensor([True, False, True]))
    assert rows["wg0: QK^T a"] == [1000.0] * PAIRS and rows["wg0: PV b"] == [300.0] * PAIRS
    assert rows["wg1: adopt a (wait + rescale)"] == [3350.0, 2600.0, 2600.0]  # from the start, then from its last PV b
    assert rows["pair period (wg0's tile a in to the next)"] == [float(PAIR_PERIOD)] * (PAIRS - 1)
    assert rows["tile a: handed over -> wg0 has it"] == [50.0] * PAIRS
    assert rows["tile b: handed over -> wg1 has it"] == [70.0] * PAIRS
    assert rows["producer: fill (tile free -> handed over)"] == [900.0] * (2 * PAIRS)
    assert rows["program: first -> last clock"] == [13_000.0]
