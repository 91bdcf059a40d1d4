"""The quantizers of quant.py (kernels on GPU and under TRITON_INTERPRET=1, references elsewhere) must be bit-exact
with reference.act_quant, fp8_fakequant, fp4_quant and fp4_fakequant."""

import os

import pytest
import torch

import mini_deepgemm as dg
from mini_deepgemm import reference
from mini_deepgemm.testing import random_bf16


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="triton 3.6's interpreter rounds fp32->e4m3 wrongly (31.625 -> 16)")
@pytest.mark.parametrize("rows", [1, 7, 130])
@pytest.mark.parametrize("K, group, fmt", [(256, 32, "ue8m0"), (5120, 32, "ue8m0"), (7168, 128, "fp32"), (1280, 128, "fp32")])
def test_fp8_quant_bit_exact(device, gen, rows, K, group, fmt):
    x = random_bf16(rows, K, generator=gen) * 37.0
    x[0, :group] = 0  # an all-zero group hits the amax clamp
    x[-1, -1] = 3e4  # a group whose scale is large
    x = x.to(device)
    q, s = dg.per_token_group_quant_fp8(x, group, fmt)
    q_ref, s_ref = reference.act_quant(x, group, fmt)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == s_ref.dtype and s.shape == (rows, K // group)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="triton 3.6's interpreter rounds fp32->e4m3 wrongly (31.625 -> 16)")
@pytest.mark.parametrize("shape", [(1, 512), (37, 512), (2, 3, 256), (4096, 512)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_round_trip_bit_exact(device, gen, shape, dtype):
    """per_token_group_fakequant_fp8 (kernel on GPU, reference elsewhere) against reference.fp8_fakequant, bit for
    bit: rows of scales 1e-3 .. 1e3, an all-zero group, values past e4m3's 448 times the scale."""
    x = (random_bf16(*shape, generator=gen) * 10 ** (torch.rand(*shape[:-1], 1, generator=gen) * 6 - 3)).to(dtype)
    rows = x.view(-1, shape[-1])
    rows[0, :32] = 0
    rows[-1, -1] = 3e4
    x = x.to(device)
    got, want = dg.per_token_group_fakequant_fp8(x), reference.fp8_fakequant(x)
    assert got.dtype == dtype and got.shape == x.shape
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))
    with pytest.raises(ValueError, match="multiple of group_size"):
        dg.per_token_group_fakequant_fp8(x[..., :40])


def test_fp8_quant_keeps_leading_dims(device, gen):
    x = random_bf16(2, 3, 64, generator=gen).to(device)
    q, s = dg.per_token_group_quant_fp8(x, 32)
    assert q.shape == (2, 3, 64) and s.shape == (2, 3, 2)


def test_fp8_quant_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        dg.per_token_group_quant_fp8(torch.randn(4, 40), 32)
    with pytest.raises(ValueError, match="scale_fmt"):
        dg.per_token_group_quant_fp8(torch.randn(4, 64), 32, "e4m3")


def test_fp4_helpers_round_trip(gen):
    x = random_bf16(5, 64, generator=gen)
    packed, s = dg.per_token_group_quant_fp4(x)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 32) and s.dtype == torch.float8_e8m0fnu
    nib = torch.stack([packed & 0xF, packed >> 4], -1).reshape(5, 64)
    assert torch.equal(dg.pack_fp4(nib), packed)
    assert torch.equal(dg.unpack_fp4(packed), reference.unpack_fp4(packed))


# the grid's midpoints x 1 (a group whose amax 6 makes the scale 1), both signs: the round-half-to-even ties
_E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0)


@pytest.mark.parametrize("shape, group, fmt", [
    ((7, 128), 32, "ue8m0"), ((3, 32, 128), 32, "ue8m0"), ((130, 512), 32, "ue8m0"), ((5, 64), 16, "ue8m0"),
    ((2, 256), 128, "ue8m0"), ((7, 512), 16, "e4m3"), ((2048, 512), 16, "e4m3"), ((3, 2, 64), 32, "e4m3")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp4_quant_and_round_trip_bit_exact(device, gen, shape, group, fmt, dtype):
    """per_token_group_quant_fp4 and per_token_group_fakequant_fp4 (kernel on GPU and under TRITON_INTERPRET=1,
    reference elsewhere) against reference.fp4_quant / fp4_fakequant run on the same device, bit for bit: random
    rows of scales 1e-3 .. 1e3, an all-zero group (the amax clamp), the ties of every midpoint, tiny negatives (-0.0
    codes); with e4m3 scales also a row whose amax / 6 passes e4m3's 448 (torch's cast: NaN)."""
    if fmt == "e4m3" and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("triton 3.6's interpreter rounds fp32->e4m3 wrongly (31.625 -> 16)")
    x = random_bf16(*shape, generator=gen).to(dtype)
    x = x * 10 ** (torch.rand(*shape[:-1], 1, generator=gen) * 6 - 3).to(dtype)
    rows = x.view(-1, shape[-1])
    rows[0, :group] = 0
    ties = torch.tensor(_E2M1_TIES + tuple(-t for t in _E2M1_TIES), dtype=dtype)
    rows[-1, :group] = ties.repeat(group // ties.numel() + 1)[:group]
    rows[-1, group - 1] = 6.0  # the group's amax: scale 1
    if shape[-1] >= 2 * group:
        rows[-1, group:2 * group] = -1e-3
        rows[-1, group] = 1.0  # the scale 2^-2 (UE8M0): -1e-3 rounds to a negative zero
    if fmt == "e4m3" and rows.shape[0] > 1:
        rows[1, :group] = 3e4  # amax / 6 = 5,000: past e4m3's range
    x = x.to(device)
    packed, scale = dg.per_token_group_quant_fp4(x, group, fmt)
    packed_ref, scale_ref = reference.fp4_quant(x, group, fmt)
    assert packed.shape == (*shape[:-1], shape[-1] // 2) and scale.shape == (*shape[:-1], shape[-1] // group)
    assert torch.equal(packed, packed_ref)
    assert scale.dtype == scale_ref.dtype and torch.equal(scale.view(torch.uint8), scale_ref.view(torch.uint8))
    round_trip = dg.per_token_group_fakequant_fp4(x, group, fmt)
    want = reference.fp4_fakequant(x, group, fmt)
    assert round_trip.dtype == dtype and round_trip.shape == x.shape
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    nan = torch.isnan(want)  # the e4m3 overflow row: NaN either way, its bit pattern the cast's choice
    assert torch.equal(torch.isnan(round_trip), nan)
    assert torch.equal(round_trip.view(bits)[~nan], want.view(bits)[~nan])


def test_fp4_bad_shapes_and_formats_raise_the_reference_errors(device, gen):
    x = random_bf16(4, 64, generator=gen).to(device)
    with pytest.raises(ValueError, match="multiple of the quant block"):
        dg.per_token_group_fakequant_fp4(x[:, :40], 32)
    with pytest.raises(ValueError, match="scale_fmt"):
        dg.per_token_group_quant_fp4(x, 32, "fp32")
