"""The fused in-place RoPE kernel (layers/rope.py) against ops.apply_rope_, and ops.rope_'s choice between them.

Kernel cases run on CUDA (marked gpu), or on CPU under the Triton interpreter when TRITON_INTERPRET=1 is set.
Metric: the un-rotated dims bit-identical (untouched); every rotated value within one rounding of the output dtype
of the reference plus a few fp32 ulps of its pair's magnitude, |fused - ref| <= 2^-p |ref| + 2^-20 |pair| (p = 7 for
bf16, 10 for fp16, 22 for fp32: the two sums of the complex product may be contracted into FMAs differently, which
moves the fp32 result by an ulp of its terms, not of the result), and for bf16 on CUDA at least 99% of the values
equal (the fraction printed). Inputs: random values, random positions up to 2^20 (large angles: the argument
reduction of cosf / sinf matters), the plain and the YaRN frequencies of V4.1-Flash, the engine's five shapes (q,
window kv, indexer queries and keys, the attention output's inverse).
"""

from __future__ import annotations

import os

import pytest
import torch

from mini_deepinfer.layers import rope as ropef
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
RELATIVE_BOUND = {BF16: 2**-7, FP16: 2**-10, FP32: 2**-22}
CFG = V41Config()

# (tokens, middle dims, dtype, inverse): q and the output [T, 64, 512], window kv [T, 512], indexer queries
# [T, 32, 128], index keys [G, 128]; one token; fp16 / fp32
SHAPES = [(4096, (CFG.num_attention_heads, CFG.head_dim), BF16, False),
          (4096, (CFG.num_attention_heads, CFG.head_dim), BF16, True),
          (37, (CFG.head_dim,), BF16, False), (300, (CFG.index_n_heads, CFG.index_head_dim), BF16, False),
          (2048, (CFG.index_head_dim,), BF16, False), (1, (CFG.num_attention_heads, CFG.head_dim), BF16, True),
          (9, (3, 128), FP16, False), (5, (128,), FP32, True)]
if torch.cuda.is_available():
    CASES = [pytest.param("cuda", *s, marks=pytest.mark.gpu) for s in SHAPES]
elif INTERPRET:
    CASES = [("cpu", 3, (4, 128), BF16, False), ("cpu", 2, (128,), FP32, True)]
else:
    CASES = [pytest.param("cuda", 1, (128,), BF16, False,
                          marks=[pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")])]
needs_triton = pytest.mark.skipif(ropef.triton is None, reason="needs triton")


def _check(got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, d_rot: int) -> None:
    assert torch.equal(got[..., :-d_rot].cpu(), before[..., :-d_rot].cpu()), "un-rotated dims must stay untouched"
    got, want, x = (t[..., -d_rot:].float().cpu() for t in (got, want, before))
    pair = x.reshape(*x.shape[:-1], d_rot // 2, 2).norm(dim=-1).repeat_interleave(2, -1)
    err = (got - want).abs()
    bound = want.abs() * RELATIVE_BOUND[before.dtype] + pair * 2**-20
    assert bool((err <= bound).all()), (err / bound.clamp_min(1e-30)).max()
    differing = (got != want).float().mean().item()
    print(f"rotated values differing from the reference: {100 * differing:.4f}%")
    if before.dtype == BF16 and not INTERPRET:  # the interpreter casts fp32 -> bf16 toward zero
        assert differing <= 0.01


@needs_triton
@pytest.mark.parametrize("role_id", [0, 2], ids=["plain", "yarn"])
@pytest.mark.parametrize("device,T,middle,dtype,inverse", CASES)
def test_fused_rope_matches_the_reference(device, T, middle, dtype, inverse, role_id) -> None:
    g = torch.Generator().manual_seed(T + len(middle) + role_id)
    freqs = ops.rope_freqs(CFG, CFG.layer_role(role_id)).to(device)
    x = (torch.randn(T, *middle, generator=g) * 4).to(dtype).to(device)
    pos = torch.randint(0, 1 << 20, (T,), generator=g)
    pos[0] = 0  # the identity rotation
    pos = pos.to(device)
    before = x.clone()
    want = ops.apply_rope_(x.clone(), pos, freqs, inverse)
    assert ropef.rope_fused_(x, pos, freqs, inverse) is x
    _check(x, want, before, 2 * freqs.shape[0])


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_rope_views_and_batch_invariance() -> None:
    """A token's result does not depend on its batch; a head-strided view (q's last 64 dims of a wider buffer)
    rotates in place; a view whose heads cannot flatten is not taken (available is False)."""
    freqs = ops.rope_freqs(CFG, CFG.layer_role(2)).cuda()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 16, 256, generator=g).bfloat16().cuda()
    pos = torch.randint(0, 1 << 17, (40,), generator=g).cuda()
    whole = ropef.rope_fused_(x.clone(), pos, freqs)
    for i in (0, 13, 39):
        assert torch.equal(ropef.rope_fused_(x[i:i + 1].clone(), pos[i:i + 1], freqs), whole[i:i + 1])
    wide = torch.randn(40, 16, 384, generator=g).bfloat16().cuda()
    wide[..., :256] = x
    view = wide[..., :256]  # stride(1) = 384: heads flatten, rows are strided
    assert ropef.available(view, freqs)
    ropef.rope_fused_(view, pos, freqs)
    assert torch.equal(wide[..., :256], whole)
    assert not ropef.available(x.view(40, 4, 4, 256).transpose(1, 2), freqs)  # heads that cannot flatten
    with pytest.raises(ValueError, match="positions of shape"):
        ropef.rope_fused_(x, pos[:3], freqs)
    assert ropef.rope_fused_(x[:0], pos[:0], freqs).shape == (0, 16, 256)


def test_rope_takes_the_kernel_only_for_kernel_weights_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """ops.rope_: the reference's plain dict and any CPU tensor take ops.apply_rope_ (the oracle stays
    kernel-free); KernelWeights on CUDA take the fused kernel."""
    freqs = ops.rope_freqs(CFG, CFG.layer_role(0))
    x, pos = torch.randn(3, 128).bfloat16(), torch.arange(3)
    calls = []
    monkeypatch.setattr(ropef, "rope_fused_", lambda *a: calls.append(a) or ops.apply_rope_(*a))
    want = ops.apply_rope_(x.clone(), pos, freqs)
    assert torch.equal(ops.rope_(x.clone(), pos, freqs, {}), want)
    assert torch.equal(ops.rope_(x.clone(), pos, freqs, ops.KernelWeights({})), want)
    assert not calls
    if torch.cuda.is_available() and ropef.triton is not None:
        xc, pc, fc = x.cuda(), pos.cuda(), freqs.cuda()
        ops.rope_(xc.clone(), pc, fc, {})
        assert not calls
        ops.rope_(xc.clone(), pc, fc, ops.KernelWeights({}))
        assert len(calls) == 1
