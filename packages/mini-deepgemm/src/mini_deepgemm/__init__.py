"""mini-deepgemm: FP8 and FP8 x FP4 GEMMs with fine-grained scaling for DeepSeek-V4.1 on Hopper (SM90).

DeepGEMM-style API: outputs preallocated by the caller, layout in the name (NT: B is [N, K]), FP8 operands as
(data, scale) tuples. See gemm.py for operand layouts, recipes and the grouped layouts, quant.py for the
quantizers. Without CUDA or triton every function falls back to the pure-torch references in reference.py.
"""

from .gemm import (
    FP4_RECIPE,
    FoldedFP4Scales,
    V3_RECIPE,
    V41_RECIPE,
    fp8_fp4_gemm_nt,
    fold_fp4_weights,
    fold_fp8_weight_scales,
    fp8_gemm_nt,
    get_m_alignment_for_contiguous_layout,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from .quant import (pack_fp4, per_token_group_fakequant_fp4, per_token_group_fakequant_fp8, per_token_group_quant_fp4,
                    per_token_group_quant_fp8, unpack_fp4)
from .reference import weight_quant_fp8
from .testing import calc_diff

__all__ = [
    "FP4_RECIPE", "V3_RECIPE", "V41_RECIPE",
    "fp8_gemm_nt", "fp8_fp4_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked",
    "get_m_alignment_for_contiguous_layout", "FoldedFP4Scales", "fold_fp4_weights",
    "fold_fp8_weight_scales",
    "per_token_group_quant_fp8", "per_token_group_fakequant_fp8", "per_token_group_quant_fp4",
    "per_token_group_fakequant_fp4", "pack_fp4", "unpack_fp4", "weight_quant_fp8",
    "calc_diff",
]
