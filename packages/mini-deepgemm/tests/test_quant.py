"""per_token_group_quant_fp8 (kernel on GPU, reference elsewhere) must be bit-exact with reference.act_quant."""

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
