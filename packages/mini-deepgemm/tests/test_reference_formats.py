"""The reference quantizers against the spec's formulas (V41_MODEL.md 3.1-3.3), element by element, edge values
included. These are the oracles every kernel is compared with, so they are checked against independent scalar
Python here rather than against themselves."""

import math

import pytest
import torch

from mini_deepgemm.reference import (
    E2M1_VALUES,
    act_dequant,
    act_quant,
    fp4_dequant,
    fp4_quant,
    fp8_fakequant,
    pack_fp4,
    unpack_fp4,
    weight_dequant_fp8,
    weight_quant_fp8,
)


def pow2_ceil(v: float) -> float:
    """2^ceil(log2 v) for v > 0, computed exactly with frexp."""
    m, e = math.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    return 2.0 ** (e - 1) if m == 0.5 else 2.0 ** e


def fp32(v: float) -> float:
    return torch.tensor(v, dtype=torch.float32).item()


@pytest.mark.parametrize("seed", [0, 1])
def test_act_quant_scale_is_pow2_ceil_of_amax_over_448(seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 128, generator=g) * torch.logspace(-6, 4, 6)[:, None]).bfloat16()
    x[0, :32] = 0  # all-zero group: amax clamps to 1e-4
    x[1, 32:64] = 448.0  # amax exactly 448 -> scale 1
    x[2, 64:96] = 2.0 ** -20
    q, s = act_quant(x, 32)
    for r in range(6):
        for b in range(4):
            grp = x[r, b * 32:(b + 1) * 32].float()
            amax = max(grp.abs().max().item(), 1e-4)
            scale = pow2_ceil(fp32(amax * fp32(1 / 448)))
            assert s[r, b].float().item() == scale
            expect = (grp / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            assert torch.equal(q[r, b * 32:(b + 1) * 32].view(torch.uint8), expect.view(torch.uint8))
    assert s[1, 1].float().item() == 1.0
    back = act_dequant(q, s, 32)
    assert torch.equal(fp8_fakequant(x), back.bfloat16())


def test_act_quant_fp32_scales_are_amax_over_448():
    x = torch.randn(4, 256).bfloat16()
    q, s = act_quant(x, 128, "fp32")
    assert s.dtype == torch.float32 and s.shape == (4, 2)
    assert torch.allclose(s, x.float().view(4, 2, 128).abs().amax(-1) / 448)
    assert (act_dequant(q, s, 128) - x.float()).abs().max() <= x.float().abs().max() / 8


def test_weight_quant_blocks():
    w = torch.randn(64, 96) * 0.02
    q, s = weight_quant_fp8(w, 32)
    assert q.shape == (64, 96) and s.shape == (2, 3) and s.dtype == torch.float8_e8m0fnu
    for i in range(2):
        for j in range(3):
            blk = w[i * 32:(i + 1) * 32, j * 32:(j + 1) * 32]
            assert s[i, j].float().item() == pow2_ceil(fp32(blk.abs().max().item() * fp32(1 / 448)))
    rel = (weight_dequant_fp8(q, s) - w).norm() / w.norm()
    assert rel < 0.05


def test_e2m1_round_half_even_at_every_tie_and_saturation():
    # one UE8M0 block whose amax is 6 (scale 1): values at every midpoint of the e2m1 grid
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # halfway cases go to the even code
    vals = torch.tensor(ties + [6.0, 7.5, -0.75, -5.0] + [0.1] * 21, dtype=torch.float32)
    q, s = fp4_quant(vals[None], 32, "ue8m0")
    assert s.float().item() == 2.0  # amax 7.5 -> 2^ceil(log2(7.5/6)) = 2
    q, s = fp4_quant((vals / 2)[None].clamp(max=3), 32, "ue8m0")  # amax 3 -> scale 0.5: same grid in units of 0.5
    deq = fp4_dequant(q, s, 32)[0]
    assert deq[:7].tolist() == [e / 2 for e in expect]
    assert deq[7].item() == 3.0 and deq[8].item() == 3.0  # 6 on the grid, saturating
    assert deq[9].item() == -0.5 and deq[10].item() == -2.0


def test_fp4_e4m3_scale_and_packing_order():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 64, generator=g).bfloat16()
    q, s = fp4_quant(x, 16, "e4m3")
    assert q.shape == (3, 32) and s.shape == (3, 4) and s.dtype == torch.float8_e4m3fn
    amax = x.float().view(3, 4, 16).abs().amax(-1)
    assert torch.equal(s.float(), (amax.clamp_min(6 * 2.0 ** -9) / 6).to(torch.float8_e4m3fn).float())
    deq = fp4_dequant(q, s, 16)
    grid = torch.tensor(E2M1_VALUES)
    for r in range(3):
        for c in range(64):
            sc = s[r, c // 16].float().item()
            a = abs(x[r, c].item())
            # nearest grid point; at an exact tie the even code (index) wins
            d = (grid * sc - a).abs()
            best = torch.nonzero(d == d.min()).flatten()
            code = best[0] if len(best) == 1 else best[(best % 2 == 0).nonzero()[0, 0]]
            assert abs(deq[r, c].item()) == grid[code].item() * sc
    nib = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert pack_fp4(nib).tolist() == [[0x21, 0x43]]  # low nibble = even column
    assert unpack_fp4(torch.tensor([[0x9A]], dtype=torch.uint8)).tolist() == [[-1.0, -0.5]]  # 0xA: -1, 0x9: -0.5
