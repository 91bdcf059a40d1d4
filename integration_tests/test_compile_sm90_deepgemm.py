"""mini-deepgemm's public APIs at DeepSeek-V4.1's real shapes, compiled for an H200 (sm_90) on a machine without a GPU.

What it checks, per call (a quantizer, a dense GEMM, a grouped MoE GEMM), inside `compiling_for_sm90()`:
- the kernels the call launches, by name and in launch order: the route that `default_config`, `_splitk_runs`,
  `_use_gluon*` and `folded` pick for an H200. Under triton 3.6 (the GPU machine's) that is the Gluon route, under
  another release (the uv lock's) the Triton one (`mini_deepgemm._backend.gluon_usable`), so each case states both
  lists, and a change of routing fails here, on CPU CI, before it reaches the GPU machine;
- that each kernel compiles for sm_90 at all (a Gluon API renamed between releases, a constexpr branch that only
  CUDA tensors take: inline PTX) and can launch there: shared memory <= 227 KiB, registers x threads <= 64K
  (`CompiledKernel.fits`);
- that no kernel has a stack frame (local memory: spills, local arrays), except the few that have one today, whose
  bytes per thread are an upper bound here (Case.local_bytes, each with the reason in a comment: spills outside the
  K loops, where they cost a few loads per tile). A kernel that starts to spill, or spills more, fails here.
Why: CPU CI runs the references and Triton's interpreter, which compile nothing, and the GPU tests run only on the
GPU machine (sm90_compile.py's docstring says more). Operands are `torch.empty` tensors, made when a case is called
inside the harness (which makes them `cuda_like`): nothing runs, so no value is read, and the real sizes cost no
memory.

Shapes (runtime/src/mini_deepinfer/models/deepseek_v41): hidden 5,120; a routed expert's w13 (w1 and w3 stacked)
[4,608, 5,120] and w2 [5,120, 2,304]; 384 routed experts, 96 per GPU at EP4; dense FP8 weights such as the shared
expert's w13 [4,608, 5,120] and wo_b [5,120, 8,192]; the window KV rows 512 wide, the indexer's 128-wide heads.
`pytest -s` prints each compiled kernel's resources (CompiledKernel.row). Cold (no triton cache) on a 2-core CPU
the file takes ~20-25 s under triton 3.9 and ~20-35 s under 3.6.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 makes the kernels interpreted functions: nothing compiles",
                allow_module_level=True)

import mini_deepgemm as dg  # noqa: E402
from mini_deepgemm import _backend, gemm  # noqa: E402
from sm90_compile import CompiledKernel, compiling_for_sm90, cuda_like  # noqa: E402

E4M3, UE8M0, FP32, BF16 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float32, torch.bfloat16
HIDDEN, MOE_INTER = 5120, 2304
W13_N, W2_N = 2 * MOE_INTER, HIDDEN  # rows of a routed expert's stacked w1 / w3, and of its w2
PREFILL_ROWS = 4096
ROUTED_EXPERTS = 384  # one GPU holds them all
LOCAL_EXPERTS = 96  # EP4
PREFILL_ROWS_PER_EXPERT = 256  # EP4 prefill: ~128-256 real rows per expert, 128-aligned segments
CHECKPOINT_SCALE_MAX = 128  # the bound the runtime states for a checkpoint's FP4 scales (amax / 6: bytes near 120)

# Kernel names, by the module that defines them
ACT_QUANT_FP8, FP4_QUANT = "act_quant_fp8_kernel", "fp4_quant_kernel"  # quant_kernel
ACT_PASS, SWAPAB = "dequant_act_kernel", "swapab_gemm_kernel"  # gemm_swapab_kernel
TRITON_GEMM = "scaled_gemm_nt_kernel"  # gemm_kernel
V41_GEMM, V3_GEMM = "fp8_gemm_v41_kernel", "fp8_gemm_v3_kernel"  # gemm_gluon_fp8_kernel
SCALES_TO_F32 = "ue8m0_to_f32_transposed_kernel"  # gemm_gluon_fp8_kernel: the V4.1 tiles' fp32 scale ring
SPLITK, SPLITK_SUM = "fp8_gemm_v41_splitk_kernel", "splitk_sum_kernel"  # gemm_gluon_fp8_splitk_kernel
FP4_GROUPED, FP4_CONTIGUOUS_WS = "fp4_grouped_gemm_kernel", "fp4_contiguous_ws_kernel"  # gemm_gluon_kernel
FP4_E4M3_CONTIGUOUS, FP4_E4M3_MASKED = "fp4_e4m3_contiguous_kernel", "fp4_e4m3_masked_kernel"  # ..._fp4_e4m3_kernel
TILE_TABLE = "contiguous_tile_table_kernel"  # gemm_gluon_fp4_e4m3_kernel: the 256-row tiles' table
TRITON_FP4_E4M3 = "fp4_e4m3_gemm_kernel"  # gemm_fp4_e4m3_kernel: the FP8-MMA route off Gluon (session 73)
# The V4.1 recipe's 128 x 128 tiles at >= 8e10 FLOPs: both operands' scales converted to fp32, then the GEMM
V41_RING = [SCALES_TO_F32, SCALES_TO_F32, V41_GEMM]


def activations(rows: int, k: int, scales: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantized activations as the runtime hands them to a GEMM: e4m3 [rows, k] with UE8M0 scales per 32
    ("ue8m0", V4.1), or fp32 scales per 128: the V3 recipe's ("fp32"), or V4.1's folded per 128 into powers of two
    ("fold_128": the form the FP8-MMA expert route runs fastest on, and the folded dense route's; same dtype)."""
    if scales == "ue8m0":
        return torch.empty(rows, k, dtype=E4M3), torch.empty(rows, k // 32, dtype=UE8M0)
    return torch.empty(rows, k, dtype=E4M3), torch.empty(rows, k // 128, dtype=FP32)


def masked_activations(groups: int, max_m: int, k: int, scales: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    q, s = activations(groups * max_m, k, scales)
    return q.view(groups, max_m, k), s.view(groups, max_m, s.shape[-1])


def fp8_weights(n: int, k: int, recipe: tuple[int, int, int] = dg.V41_RECIPE, groups: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 [(G,) n, k] with the recipe's block scales: UE8M0 per 32 x 32 (V4.1) or fp32 per 128 x 128 (V3)."""
    lead = () if groups is None else (groups,)
    block = recipe[1]
    scale_dtype = UE8M0 if recipe == dg.V41_RECIPE else FP32
    return torch.empty(*lead, n, k, dtype=E4M3), torch.empty(*lead, n // block, k // block, dtype=scale_dtype)


def fp4_weights(n: int, k: int, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed e2m1 [(G,) n, k / 2] with UE8M0 scales per weight row and 32 of K."""
    lead = () if groups is None else (groups,)
    return torch.empty(*lead, n, k // 2, dtype=torch.uint8), torch.empty(*lead, n, k // 32, dtype=UE8M0)


def folded_scales(groups: int, n: int, k: int) -> dg.FoldedFP4Scales:
    """fold_fp4_weights's scales, in their shapes and dtypes (test_fold_fp4_weights_takes_the_route checks them
    against the function): folding real weights of these sizes on the host would take longer than the compiles."""
    return dg.FoldedFP4Scales(torch.empty(groups, n, k // 128, dtype=torch.int32), torch.empty(groups, n, dtype=FP32))


# --------------------------------------------------------------------------- the calls
def quant_fp8(rows: int, k: int, group: int, scale_fmt: str, fold_128: bool = False) -> Callable[[], None]:
    return lambda: dg.per_token_group_quant_fp8(torch.empty(rows, k, dtype=BF16), group, scale_fmt, fold_128=fold_128)


def fakequant_fp8(rows: int, k: int) -> Callable[[], None]:
    return lambda: dg.per_token_group_fakequant_fp8(torch.empty(rows, k, dtype=BF16), 32)


def quant_fp4(rows: int, k: int, group: int, scale_fmt: str) -> Callable[[], None]:
    return lambda: dg.per_token_group_quant_fp4(torch.empty(rows, k, dtype=BF16), group, scale_fmt)


def fakequant_fp4(rows: int, k: int, group: int, scale_fmt: str) -> Callable[[], None]:
    return lambda: dg.per_token_group_fakequant_fp4(torch.empty(rows, k, dtype=BF16), group, scale_fmt)


def dense_fp8(rows: int, n: int, k: int, recipe: tuple[int, int, int] = dg.V41_RECIPE) -> Callable[[], None]:
    scales = "ue8m0" if recipe == dg.V41_RECIPE else "fp32"
    return lambda: dg.fp8_gemm_nt(activations(rows, k, scales), fp8_weights(n, k, recipe),
                                  torch.empty(rows, n, dtype=BF16))


def dense_fp4(rows: int, n: int, k: int) -> Callable[[], None]:
    return lambda: dg.fp8_fp4_gemm_nt(activations(rows, k), fp4_weights(n, k), torch.empty(rows, n, dtype=BF16))


def moe_fp4_contiguous(n: int, k: int, scales: str = "ue8m0", folded: bool = False, experts: int = LOCAL_EXPERTS,
                       rows_per_expert: int = PREFILL_ROWS_PER_EXPERT) -> Callable[[], None]:
    """MoE prefill: `experts` experts of `rows_per_expert` rows (stated as expected_m, as the runtime does), with the
    runtime's scale bound; folded: the FP8-MMA route (fold_fp4_weights's weights and scales)."""
    rows = experts * max(128, rows_per_expert)

    def call() -> None:
        dg.m_grouped_fp8_fp4_gemm_nt_contiguous(
            activations(rows, k, scales), fp4_weights(n, k, experts), torch.empty(rows, n, dtype=BF16),
            torch.empty(rows, dtype=torch.int32), weight_scale_max=CHECKPOINT_SCALE_MAX,
            folded=folded_scales(experts, n, k) if folded else None, expected_m=rows_per_expert)
    return call


# MoE decode in the masked layout, (experts, rows reserved per expert, expected rows per expert): one GPU's 384
# experts at a 64-token batch (~1 row each: 64 x 6 / 384), and EP4's 96 at ~8 and ~32 rows per expert. The FP4 cases
# compile on COMPILE_EXPERTS of them (as do the contiguous layout's on folded weights and per-32 activations): the
# expert count only sizes the grid, so the same kernels compile (SASS digests equal at 16 and at 384 / 96 experts,
# session 77), but not the same CPU work around them. Under the uv lock's triton the folded per-32 cases reorder
# every expert's weights on the CPU (gemm._gemm), ~90 s a case at 384 experts.
COMPILE_EXPERTS = 16
MASKED_DECODE = {1: (ROUTED_EXPERTS, 64, 1), 8: (LOCAL_EXPERTS, 128, 8), 32: (LOCAL_EXPERTS, 256, 32)}


def moe_fp4_masked(expected_m: int, n: int, k: int, scales: str = "ue8m0", folded: bool = False
                   ) -> Callable[[], None]:
    _, max_m, expected_m = MASKED_DECODE[expected_m]
    groups = COMPILE_EXPERTS

    def call() -> None:
        dg.m_grouped_fp8_fp4_gemm_nt_masked(
            masked_activations(groups, max_m, k, scales), fp4_weights(n, k, groups),
            torch.empty(groups, max_m, n, dtype=BF16), torch.empty(groups, dtype=torch.int32), expected_m,
            weight_scale_max=CHECKPOINT_SCALE_MAX, folded=folded_scales(groups, n, k) if folded else None)
    return call


def moe_fp8_contiguous(n: int, k: int, recipe: tuple[int, int, int] = dg.V41_RECIPE) -> Callable[[], None]:
    rows = LOCAL_EXPERTS * PREFILL_ROWS_PER_EXPERT
    scales = "ue8m0" if recipe == dg.V41_RECIPE else "fp32"
    return lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
        activations(rows, k, scales), fp8_weights(n, k, recipe, groups=LOCAL_EXPERTS),
        torch.empty(rows, n, dtype=BF16), torch.empty(rows, dtype=torch.int32), recipe=recipe)


def moe_fp8_masked(expected_m: int, n: int, k: int, recipe: tuple[int, int, int] = dg.V41_RECIPE
                   ) -> Callable[[], None]:
    groups, max_m, expected_m = MASKED_DECODE[expected_m]
    scales = "ue8m0" if recipe == dg.V41_RECIPE else "fp32"
    return lambda: dg.m_grouped_fp8_gemm_nt_masked(
        masked_activations(groups, max_m, k, scales), fp8_weights(n, k, recipe, groups=groups),
        torch.empty(groups, max_m, n, dtype=BF16),
        torch.empty(groups, dtype=torch.int32), expected_m, recipe=recipe)


@dataclass(frozen=True)
class Case:
    """One public call and the kernels it must compile, in launch order, on the Gluon route (triton 3.6) and on the
    Triton route (other releases, or MINI_DEEPGEMM_GLUON=0)."""

    name: str
    call: Callable[[], None]
    gluon: list[str]
    triton: list[str]
    local_bytes: dict[str, int] = field(default_factory=dict)  # kernel name -> its stack bytes today (else 0)


def folded_case(name: str, call: Callable[[], None], gluon: list[str], scales: str,
                local_bytes: dict[str, int] | None = None) -> Case:
    """A call on folded FP4 weights (the FP8-MMA route). On the Triton route (the switch on, triton_fp8_moe
    below), activations folded per 128 take gemm_fp4_e4m3_kernel (session 73; no spills at its
    tiles); per-32 ones read the weights back and take the bf16 route's kernels, as unfolded weights do (contiguous:
    the activation pass, then swap-AB; masked: swap-AB)."""
    contiguous = "contiguous" in name
    triton = [TRITON_FP4_E4M3] if scales == "fold_128" else [ACT_PASS, SWAPAB] if contiguous else [SWAPAB]
    return Case(name, call, gluon, triton, local_bytes=local_bytes or {})


CASES: list[Case] = [
    # quantizers (the same Triton kernels on both routes): the GEMMs' activations, V4.1's (UE8M0 per 32, also
    # folded per 128) and the V3 recipe's (fp32 per 128), and the other two pairings the API takes
    Case("quant_fp8_ue8m0_g32", quant_fp8(PREFILL_ROWS, HIDDEN, 32, "ue8m0"), [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    Case("quant_fp8_ue8m0_g32_fold128", quant_fp8(PREFILL_ROWS, HIDDEN, 32, "ue8m0", fold_128=True),
         [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    Case("quant_fp8_ue8m0_g128", quant_fp8(PREFILL_ROWS, HIDDEN, 128, "ue8m0"), [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    Case("quant_fp8_fp32_g32", quant_fp8(PREFILL_ROWS, HIDDEN, 32, "fp32"), [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    Case("quant_fp8_fp32_g128", quant_fp8(PREFILL_ROWS, HIDDEN, 128, "fp32"), [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    # the attention's round trips and the KV cache's packing (ops.fake_quant, mini_flashmla.cache_layout)
    Case("fakequant_fp8_window_kv", fakequant_fp8(PREFILL_ROWS, 512), [ACT_QUANT_FP8], [ACT_QUANT_FP8]),
    # an 8-byte stack frame that no instruction touches (the SASS has no STL / LDL; ptxas 3.6 and 3.9 alike)
    Case("quant_fp4_e4m3_g16_kv", quant_fp4(PREFILL_ROWS, 512, 16, "e4m3"), [FP4_QUANT], [FP4_QUANT],
         local_bytes={FP4_QUANT: 8}),
    Case("quant_fp4_ue8m0_g32_index_k", quant_fp4(PREFILL_ROWS, 128, 32, "ue8m0"), [FP4_QUANT], [FP4_QUANT]),
    Case("fakequant_fp4_e4m3_g16_kv", fakequant_fp4(PREFILL_ROWS, 512, 16, "e4m3"), [FP4_QUANT], [FP4_QUANT]),
    Case("fakequant_fp4_ue8m0_g32_index_q", fakequant_fp4(PREFILL_ROWS, 32 * 128, 32, "ue8m0"),
         [FP4_QUANT], [FP4_QUANT]),
    # dense FP8, V4.1 recipe. Prefill: Gluon 128 x 128 tiles with the scale ring / Triton swap-AB 256 x 128 tiles
    # after an activation pass. The Gluon kernel (168 registers: 232 per math warpgroup) spills 32 bytes: 23
    # STL / LDL, all in a tile's set-up and epilogue, none in the K loops (the SASS's innermost loops with MMAs)
    Case("fp8_v41_m4096_n4608_k5120", dense_fp8(4096, 4608, 5120), V41_RING, [ACT_PASS, SWAPAB],
         local_bytes={V41_GEMM: 32}),
    Case("fp8_v41_m4096_n5120_k8192", dense_fp8(4096, 5120, 8192), V41_RING, [ACT_PASS, SWAPAB],
         local_bytes={V41_GEMM: 32}),
    # decode: split-K up to 16 rows (Gluon) / swap-AB 16-token tiles (Triton); at 64 rows split-K only where
    # _splitk_runs measured it faster (K = 8,192), else the Gluon 64 x 32 tiles; Triton: gemm_kernel's 64-row tiles
    Case("fp8_v41_m1_n4608_k5120", dense_fp8(1, 4608, 5120), [SPLITK, SPLITK_SUM], [SWAPAB]),
    Case("fp8_v41_m16_n4608_k5120", dense_fp8(16, 4608, 5120), [SPLITK, SPLITK_SUM], [SWAPAB]),
    Case("fp8_v41_m64_n4608_k5120", dense_fp8(64, 4608, 5120), [V41_GEMM], [TRITON_GEMM]),
    Case("fp8_v41_m1_n5120_k8192", dense_fp8(1, 5120, 8192), [SPLITK, SPLITK_SUM], [SWAPAB]),
    Case("fp8_v41_m16_n5120_k8192", dense_fp8(16, 5120, 8192), [SPLITK, SPLITK_SUM], [SWAPAB]),
    Case("fp8_v41_m64_n5120_k8192", dense_fp8(64, 5120, 8192), [SPLITK, SPLITK_SUM], [TRITON_GEMM]),
    # dense FP8, V3 recipe (also V4.1's operands folded per 128: fold_fp8_weight_scales, quant's fold_128)
    Case("fp8_v3_m4096_n4608_k5120", dense_fp8(4096, 4608, 5120, dg.V3_RECIPE), [V3_GEMM], [TRITON_GEMM]),
    Case("fp8_v3_m4096_n5120_k8192", dense_fp8(4096, 5120, 8192, dg.V3_RECIPE), [V3_GEMM], [TRITON_GEMM]),
    # dense FP8 x FP4: the swap-AB kernel on both routes (no Gluon kernel for dense FP4 weights)
    Case("fp4_m4096_n4608_k5120", dense_fp4(4096, 4608, 5120), [ACT_PASS, SWAPAB], [ACT_PASS, SWAPAB]),
    Case("fp4_m16_n4608_k5120", dense_fp4(16, 4608, 5120), [SWAPAB], [SWAPAB]),
    # MoE prefill, FP4 experts: Gluon's warp-specialized kernel (Triton: swap-AB 128 x 128) after an activation pass
    Case("moe_fp4_contiguous_w13", moe_fp4_contiguous(W13_N, HIDDEN), [ACT_PASS, FP4_CONTIGUOUS_WS],
         [ACT_PASS, SWAPAB]),
    Case("moe_fp4_contiguous_w2", moe_fp4_contiguous(W2_N, MOE_INTER), [ACT_PASS, FP4_CONTIGUOUS_WS],
         [ACT_PASS, SWAPAB]),
    # ... on FP8 MMAs (folded weights), no activation pass: 128-row tiles on per-32 activations, 256-row tiles
    # from the device-built tile table on activations folded per 128 (the runtime's form) at >= 128 rows per expert.
    # The 256-row tiles spill 40 bytes (25 STL / LDL, in a tile's set-up and epilogue, none in the K loops), as
    # _fp4_e4m3_gemm's register split (216 per math warpgroup) says. The per-32 cases on COMPILE_EXPERTS experts
    # (MASKED_DECODE's comment says why)
    folded_case("moe_fp4_contiguous_w13_folded", moe_fp4_contiguous(W13_N, HIDDEN, folded=True,
                                                                    experts=COMPILE_EXPERTS),
                [FP4_E4M3_CONTIGUOUS], "ue8m0"),
    folded_case("moe_fp4_contiguous_w2_folded", moe_fp4_contiguous(W2_N, MOE_INTER, folded=True,
                                                                   experts=COMPILE_EXPERTS),
                [FP4_E4M3_CONTIGUOUS], "ue8m0"),
    folded_case("moe_fp4_contiguous_w13_folded_fold128", moe_fp4_contiguous(W13_N, HIDDEN, "fold_128", True),
                [TILE_TABLE, FP4_E4M3_CONTIGUOUS], "fold_128", {FP4_E4M3_CONTIGUOUS: 40}),
    folded_case("moe_fp4_contiguous_w2_folded_fold128", moe_fp4_contiguous(W2_N, MOE_INTER, "fold_128", True),
                [TILE_TABLE, FP4_E4M3_CONTIGUOUS], "fold_128", {FP4_E4M3_CONTIGUOUS: 40}),
    # ... one GPU's prefill of 4,096 tokens (384 experts of ~64 rows): 128-row tiles on activations folded per 128,
    # fed by two feeder warpgroups (no producer warp) since session 70
    *(folded_case(f"moe_fp4_contiguous_{w}_folded_fold128_e64", moe_fp4_contiguous(n, k, "fold_128", True,
                                                                                   ROUTED_EXPERTS, 64),
                  [FP4_E4M3_CONTIGUOUS], "fold_128")
      for w, n, k in (("w13", W13_N, HIDDEN), ("w2", W2_N, MOE_INTER))),
    # ... one GPU's prefill of 2,048 tokens (384 experts of ~32 rows): the swap-AB kernel over the layout's 128-row
    # blocks (gemm.CONTIGUOUS_SWAPAB_MAX_ROWS), split as the masked layout's ~32 rows are. The narrow launch's 32-token
    # tile spills 32 bytes (the masked form's 8): the block's expert and the block are two values where the masked
    # form has one, and at the 128-register cap that costs an STL.64 / LDL.64 pair around each ring refill in the K
    # loop (as measured: 1.11-1.15x the contiguous kernel at ~32 rows, H100, session 54 run 2)
    *(folded_case(f"moe_fp4_contiguous_{w}_folded_fold128_e32", moe_fp4_contiguous(n, k, "fold_128", True,
                                                                                   ROUTED_EXPERTS, 32),
                  [FP4_E4M3_MASKED] * 2, "fold_128", {FP4_E4M3_MASKED: 32})
      for w, n, k in (("w13", W13_N, HIDDEN), ("w2", W2_N, MOE_INTER))),
    # MoE decode, FP4 experts: Gluon after a pass over the used rows (Triton: swap-AB, dequantizing in the tile)
    Case("moe_fp4_masked_w13_e1", moe_fp4_masked(1, W13_N, HIDDEN), [ACT_PASS, FP4_GROUPED], [SWAPAB]),
    Case("moe_fp4_masked_w13_e8", moe_fp4_masked(8, W13_N, HIDDEN), [ACT_PASS, FP4_GROUPED], [SWAPAB]),
    Case("moe_fp4_masked_w13_e32", moe_fp4_masked(32, W13_N, HIDDEN), [ACT_PASS, FP4_GROUPED], [SWAPAB]),
    Case("moe_fp4_masked_w2_e8", moe_fp4_masked(8, W2_N, MOE_INTER), [ACT_PASS, FP4_GROUPED], [SWAPAB]),
    # ... on FP8 MMAs (folded weights): 8 / 16 / 32-token tiles (_masked_tile), on both activation forms. On
    # activations folded per 128 the 32-token tile is two launches (_masked_launches): experts of up to 32 rows on
    # 32-token tiles capped at 128 registers, which spill 8 bytes (one STL.64 before the tile loop and one LDL.64 per
    # tile after its K loop), the others on 64-token tiles
    *(folded_case(f"moe_fp4_masked_{w}_e{e}_folded{suffix}", moe_fp4_masked(e, n, k, scales, True),
                  [FP4_E4M3_MASKED] * (2 if (e, scales) == (32, "fold_128") else 1), scales,
                  {FP4_E4M3_MASKED: 8} if (e, scales) == (32, "fold_128") else None)
      for scales, suffix in (("ue8m0", ""), ("fold_128", "_fold128"))
      for e in (1, 8, 32)
      for w, n, k in (("w13", W13_N, HIDDEN), ("w2", W2_N, MOE_INTER))),
    # FP8 experts (the grouped FP8-weight GEMMs): swap-AB on both routes (Gluon covers FP4 weights only)
    Case("moe_fp8_contiguous_w13", moe_fp8_contiguous(W13_N, HIDDEN), [ACT_PASS, SWAPAB], [ACT_PASS, SWAPAB]),
    Case("moe_fp8_contiguous_w2", moe_fp8_contiguous(W2_N, MOE_INTER), [ACT_PASS, SWAPAB], [ACT_PASS, SWAPAB]),
    Case("moe_fp8_masked_w13_e1", moe_fp8_masked(1, W13_N, HIDDEN), [SWAPAB], [SWAPAB]),
    Case("moe_fp8_masked_w13_e8", moe_fp8_masked(8, W13_N, HIDDEN), [SWAPAB], [SWAPAB]),
    Case("moe_fp8_masked_w13_e32", moe_fp8_masked(32, W13_N, HIDDEN), [SWAPAB], [SWAPAB]),
    # the V3 recipe's grouped GEMMs (fp32 scales per 128): gemm_kernel's grouped layouts on both routes
    Case("moe_fp8_v3_contiguous_w13", moe_fp8_contiguous(W13_N, HIDDEN, dg.V3_RECIPE), [TRITON_GEMM], [TRITON_GEMM]),
    Case("moe_fp8_v3_masked_w13_e8", moe_fp8_masked(8, W13_N, HIDDEN, dg.V3_RECIPE), [TRITON_GEMM], [TRITON_GEMM]),
]


@pytest.fixture(autouse=True)
def triton_fp8_moe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton route's folded MoE calls as its default routes them (gemm_fp4_e4m3_kernel), whatever
    MINI_DEEPGEMM_TRITON_FP8_MOE says in the environment that runs the tests."""
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: True, raising=False)  # raising: older trees (sass_diff)


def compile_case(case: Case) -> list[CompiledKernel]:
    with compiling_for_sm90() as kernels:
        case.call()
    for k in kernels:
        print(k.row(case.name))
    return kernels


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_compiles_for_sm90(case: Case) -> None:
    kernels = compile_case(case)
    names = [k.name for k in kernels]
    route = "gluon" if _backend.gluon_usable() else "triton"
    assert names == (case.gluon if route == "gluon" else case.triton), f"the {route} route's kernels"
    assert [problem for k in kernels for problem in k.fits()] == []
    # stack bytes per thread: none, or no more than the case states (Case.local_bytes)
    assert {k.name: k.local_bytes for k in kernels if k.local_bytes > case.local_bytes.get(k.name, 0)} == {}
    # the H200's swap-AB FP4 kernels convert e2m1 by inline PTX (FP4_ASM); a False here would mean the call
    # compiled the interpreter's variant (a buffer that is not cuda_like: sm90_compile._AllocationsCudaLike)
    interpreter_variants = [k.constexprs for k in kernels if "W_IS_FP4=True" in k.constexprs
                            and "FP4_ASM=True" not in k.constexprs]
    assert interpreter_variants == []


def test_fold_fp4_weights_takes_the_route() -> None:
    """fold_fp4_weights on an H200's tensors: the FP8-MMA route's weights and scales in the shapes folded_scales
    builds, on either route (the Triton route's FP8-MMA kernel takes them unless MINI_DEEPGEMM_TRITON_FP8_MOE=0, session
    76). Real scale bytes (120: a checkpoint's), since the function reads them; host work only, no kernel."""
    groups, n, k = 2, 256, 512
    bq = cuda_like(torch.zeros(groups, n, k // 2, dtype=torch.uint8))
    sb = cuda_like(torch.full((groups, n, k // 32), 120, dtype=torch.uint8)).view(UE8M0)
    with compiling_for_sm90() as kernels:
        route = dg.fold_fp4_weights(bq, sb)
    assert kernels == [] and route is not None
    weights, folded = route
    want = folded_scales(groups, n, k)
    assert weights.shape == bq.shape and weights.dtype == bq.dtype
    assert [(t.dtype, t.shape) for t in folded] == [(t.dtype, t.shape) for t in want]
