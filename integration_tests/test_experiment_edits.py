"""The kernel-variant experiments edit a kernel module's source (benchmarks/source_variants.py), so an edit written
against one version of a kernel stops applying when the kernel changes, and the experiment then fails on the GPU
machine, in device time. Session 51 found exp_moe_breakdown.py's masked and promotion edits stale (the folded masked
loop on register operands since session 26, the 256-row tiles' second accumulator since session 38). Here the
targeted edits of the experiments (not the ones that swap a whole function for a session's old text) are applied to
today's source, as text: nothing compiles or runs."""

from __future__ import annotations

import pytest
from source_variants import absolute_imports, edited_source

import exp_flashmla_gluon_breakdown
import exp_flashmla_yield
import exp_gemm_gluon_v3_variants
import exp_moe_breakdown
import exp_weight_stream
import mini_deepgemm.gemm_gluon_kernel


def experiment_edits() -> dict[str, tuple[object, list]]:
    """variant name -> (the kernel module it edits, its edits)."""
    out = {f"moe_{kind}_{name}": (exp_moe_breakdown.kernel_module, [absolute_imports("mini_deepgemm"), *edits])
           for kind, variants in exp_moe_breakdown.VARIANTS.items() for name, edits in variants.items()}
    out.update({f"attn_{name}": (exp_flashmla_gluon_breakdown.kernel_module, edits)
                for name, edits in exp_flashmla_gluon_breakdown.VARIANTS.items()})
    out.update({f"attn_yield_{name}": (exp_flashmla_yield.kernel_module, edits)
                for name, edits in exp_flashmla_yield.VARIANTS.items()})
    out["v3_a_regs"] = (exp_gemm_gluon_v3_variants.kernel_module, exp_gemm_gluon_v3_variants.A_REGS)
    out["masked_blocked_weights"] = (mini_deepgemm.gemm_gluon_kernel, exp_weight_stream.BLOCKED_WEIGHTS)
    return out


EDITS = experiment_edits()


@pytest.mark.parametrize("variant", list(EDITS))
def test_experiment_edits_apply(variant: str) -> None:
    module, edits = EDITS[variant]
    compile(edited_source(module, edits, variant), f"{variant}.py", "exec")  # applies, and is still Python
