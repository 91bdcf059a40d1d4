"""The kernel-variant experiments edit a kernel module's source (benchmarks/source_variants.py), so an edit written
against one version of a kernel stops applying when the kernel changes, and the experiment then fails on the GPU
machine, in device time. Session 51 found exp_moe_breakdown.py's masked and promotion edits stale (the folded masked
loop on register operands since session 26, the 256-row tiles' second accumulator since session 38). Here every
variant's edits are applied to today's source, as text: nothing compiles or runs."""

from __future__ import annotations

import pytest
from source_variants import absolute_imports, edited_source

import exp_flashmla_gluon_breakdown
import exp_moe_breakdown


@pytest.mark.parametrize("kind,variant", [(kind, name) for kind, variants in exp_moe_breakdown.VARIANTS.items()
                                          for name in variants])
def test_moe_breakdown_edits_apply(kind: str, variant: str) -> None:
    edits = [absolute_imports("mini_deepgemm"), *exp_moe_breakdown.VARIANTS[kind][variant]]
    source = edited_source(exp_moe_breakdown.kernel_module, edits, f"{kind}_{variant}")
    compile(source, f"{kind}_{variant}.py", "exec")  # still Python


@pytest.mark.parametrize("variant", list(exp_flashmla_gluon_breakdown.VARIANTS))
def test_attention_breakdown_edits_apply(variant: str) -> None:
    source = edited_source(exp_flashmla_gluon_breakdown.kernel_module,
                           exp_flashmla_gluon_breakdown.VARIANTS[variant], f"attn_{variant}")
    compile(source, f"attn_{variant}.py", "exec")
