"""Experiment (session 62, CPU): what the split decode's bf16 partials cost in accuracy.

Split decode writes each split's output over its own row sum and its lse; combine_splits_kernel merges them. Session
62 writes the partials in bf16 instead of fp32 (half the bytes the split kernel writes and the merge reads back,
1.08-1.17x at batch 8-64: docs/reports/flashmla-gluon.md, "Session 62"). Here, in torch on the CPU, one query of 64
heads over 640 random bf16 rows of 512 (the V4.1 decode slots) in 10 splits of 64 (batch 8's split count): the
output's relative L2 error to a float64 softmax, unsplit, with fp32 partials and with bf16 partials, averaged over 8
seeds. Unsplit and each bf16 partial are the reference itself (sparse_attn_ref on all the slots or on one split's: a
split's output over its own row sum, rounded to bf16, and its lse); an fp32 partial is the reference's one-block
step without that last rounding. Session 62: 2.05e-3, 1.97e-3 and 2.43e-3 (the tests' bound is 5e-3).

    cd benchmarks && python3 exp_split_partials_error.py
"""

from __future__ import annotations

import torch
from mini_flashmla.reference import SPARSE_ATTN_BLOCK, sparse_attn_ref

HEADS, D, SLOTS, SPLITS, TRIALS = 64, 512, 640, 10, 8
SCALE = D ** -0.5


def fp32_partial(q: torch.Tensor, kv: torch.Tensor, ids: torch.Tensor):
    """(output over its own row sum in fp32, lse) of one split of one block: sparse_attn_ref's step unrounded."""
    s = torch.einsum("hd,kd->hk", q[0].float(), kv[ids[0].long()].float()) * SCALE
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    row_sum = p.sum(-1, keepdim=True)
    out = (p.bfloat16().float() @ kv[ids[0].long()].float()) / row_sum  # P rounded to bf16 before P.V
    return out, (m + row_sum.log()).squeeze(-1)


def merged(parts: list) -> torch.Tensor:
    """combine_splits_kernel's merge without a sink: the partials weighted by their softmax over the lses."""
    weights = torch.softmax(torch.stack([lse for _, lse in parts]), 0)
    return sum(w[:, None] * out for w, (out, _) in zip(weights, parts))


def main() -> None:
    assert SLOTS // SPLITS == SPARSE_ATTN_BLOCK  # fp32_partial is one block's step
    torch.manual_seed(0)
    errors = {"unsplit": [], "fp32 partials": [], "bf16 partials": []}
    for _ in range(TRIALS):
        q = torch.randn(1, HEADS, D).bfloat16()
        kv = torch.randn(SLOTS, D).bfloat16()
        ids = torch.arange(SLOTS, dtype=torch.int32)[None, :]
        splits = ids.split(SLOTS // SPLITS, dim=1)
        s = torch.einsum("hd,kd->hk", q[0].double(), kv.double()) * SCALE
        exact = torch.softmax(s, -1) @ kv.double()
        bf16_parts = [sparse_attn_ref(q, kv, part.contiguous(), SCALE) for part in splits]
        outputs = {"unsplit": sparse_attn_ref(q, kv, ids, SCALE)[0][0].float(),
                   "fp32 partials": merged([fp32_partial(q, kv, part) for part in splits]),
                   "bf16 partials": merged([(out[0].float(), lse[0]) for out, lse in bf16_parts])}
        for name, out in outputs.items():
            errors[name].append(((out.bfloat16().double() - exact).norm() / exact.norm()).item())
    for name, values in errors.items():
        print(f"{name}: relative L2 to float64 {sum(values) / len(values):.3e} (max {max(values):.3e})")


if __name__ == "__main__":
    main()
