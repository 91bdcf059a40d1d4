"""Experiment (session 62, CPU): what the split decode's bf16 partials cost in accuracy.

Split decode writes each split's output over its own row sum and its lse; combine_splits_kernel merges them. Session
62 writes the partials in bf16 instead of fp32 (half the bytes the split kernel writes and the merge reads back,
1.13-1.17x at batch 8-64 on an H100: docs/reports/flashmla-gluon.md, "Session 62"). Here, in torch on the CPU, one
query of 64 heads over 640 random bf16 rows of 512 (the V4.1 decode slots) in 10 splits of 64 (batch 8's split
count), with the kernel's rounding points (P to bf16 before P.V, fp32 sums, the output rounded to bf16): the output's
relative L2 error to a float64 softmax, unsplit, with fp32 partials and with bf16 partials, averaged over 8 seeds.
Session 62: 2.08e-3, 1.97e-3 and 2.43e-3 (the tests' bound is 5e-3).

    cd benchmarks && python3 exp_split_partials_error.py
"""

from __future__ import annotations

import torch

HEADS, D, SLOTS, SPLITS, TRIALS = 64, 512, 640, 10, 8


def split_output(s: torch.Tensor, kv: torch.Tensor, lo: int, hi: int, dtype: torch.dtype):
    """(output over its own row sum, rounded to dtype, lse) of slots lo .. hi - 1, as a split of the kernel."""
    part = s[:, lo:hi].float()
    m = part.max(-1, keepdim=True).values
    p = torch.exp(part - m)
    row_sum = p.sum(-1, keepdim=True)
    out = (p.bfloat16().float() @ kv[lo:hi].float()) / row_sum  # P rounded to bf16 before P.V
    return out.to(dtype).float(), (m + row_sum.log()).squeeze(-1)


def merged(parts: list) -> torch.Tensor:
    weights = torch.softmax(torch.stack([lse for _, lse in parts]), 0)
    return sum(w[:, None] * out for w, (out, _) in zip(weights, parts))


def main() -> None:
    torch.manual_seed(0)
    errors = {"unsplit": [], "fp32 partials": [], "bf16 partials": []}
    for _ in range(TRIALS):
        q = torch.randn(HEADS, D).bfloat16().double()
        kv = torch.randn(SLOTS, D).bfloat16().double()
        s = (q @ kv.T) * D ** -0.5
        exact = torch.softmax(s, -1) @ kv
        outputs = {"unsplit": split_output(s, kv, 0, SLOTS, torch.float32)[0]}
        for name, dtype in (("fp32 partials", torch.float32), ("bf16 partials", torch.bfloat16)):
            bounds = [i * SLOTS // SPLITS for i in range(SPLITS + 1)]
            outputs[name] = merged([split_output(s, kv, lo, hi, dtype) for lo, hi in zip(bounds, bounds[1:])])
        for name, out in outputs.items():
            errors[name].append(((out.bfloat16().double() - exact).norm() / exact.norm()).item())
    for name, values in errors.items():
        print(f"{name}: relative L2 to float64 {sum(values) / len(values):.3e} (max {max(values):.3e})")


if __name__ == "__main__":
    main()
