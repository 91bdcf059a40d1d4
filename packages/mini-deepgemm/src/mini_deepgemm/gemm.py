"""Public FP8 / FP8 x FP4 NT GEMMs (DeepGEMM-style API): D = C + A @ B^T, outputs preallocated by the caller.

Operands (NT: both K-major, last dim contiguous)
- a = (q, sa): q float8_e4m3fn [M, K] (masked: [G, max_m, K]); sa row-major [M, K/gran_k] (masked with a
  leading G), as `per_token_group_quant_fp8` returns it.
- b = (q, sb): FP8 weights q float8_e4m3fn [N, K], sb [ceil(N/gran_n), K/gran_k]; or FP4 weights (the
  `fp8_fp4_*` functions) q uint8/int8 [N, K/2] packed e2m1 (low nibble = even k), sb float8_e8m0fnu [N, K/32].
  Grouped GEMMs take a leading G on both.
- d: bf16 (or fp32) [M, N] (masked: [G, max_m, N]); c: optional fp32 tensor of d's shape and strides (may be
  d itself) added to the product; needs an fp32 d.

Recipes (rows of A per scale, rows of B per scale, K per scale)
- V4.1 (default for UE8M0 scales): (1, 32, 32), sa and sb float8_e8m0fnu.
- DeepSeek-V3 (default for fp32 scales): (1, 128, 128), sa and sb float32.
- FP4 weights: (1, 1, 32) with UE8M0 scales, fixed. Their activations may instead come folded per 128: sa
  float32 [M, K/128] powers of two (`per_token_group_quant_fp8(x, 32, "ue8m0", fold_128=True)`, below).

Grouped layouts (what mini-deepep's dispatch produces, so no copy is needed in between)
- Contiguous (prefill): rows sorted by local expert, each expert's segment starting at a multiple of
  `get_m_alignment_for_contiguous_layout()` (128), its rows first and its padding after them; grouped_layout
  int32 [M] = expert id per row, -1 for padding rows. Padding rows of d are left untouched (not written). The
  kernels skip a 128-row tile (or a 64-row half of one) whose first row is padding. The FP8 x FP4 form takes an
  optional expected_m, the typical real rows per expert (a tile-height hint; a layout of a fixed capacity should
  give it, since M / G then counts the spare rows); on the FP8-MMA route with folded activations it also picks
  the kernel: up to CONTIGUOUS_SWAPAB_MAX_ROWS rows the masked layout's swap-AB kernel over the 128-row blocks (the
  same bits).
- Masked (decode): group g uses rows [0, masked_m[g]) of a[g]; the other rows of d[g] are left untouched.
  expected_m is a host-side hint of the typical rows per group (it picks the tile height).

FP4 weights' scale bound (the grouped `fp8_fp4_*` functions): weight_scale_max, the caller's upper bound on b's
UE8M0 scale bytes (default 255: none known). At <= 128 (scales <= 2; a checkpoint's FP4 scales are amax / 6, bytes
near 120) the Gluon kernels fold the e2m1 conversion's 2^126 multiply into the scale: bitwise the same result,
1.02-1.06x on the masked GEMM and 1.03-1.04x on the contiguous one (session 16 run 1, docs/reports/deepgemm-gluon.md).
Read it once per weight tensor (`int(sb.view(torch.uint8).max())`, a host sync) when the weights are loaded, not
per call; a byte above the stated bound makes its values inf or NaN. Every FP4 kernel reads scale byte 0 as 0 (the
reference: 2^-127).

FP4 weights on FP8 MMAs (the grouped `fp8_fp4_*` functions' `folded`): `fold_fp4_weights(bq, sb)`, once per
weight tensor at load, folds each weight row's per-32 scales into its e4m3 conversion and returns the packed weights
reordered for the route's kernels (reference.fp4_to_fp8_mma_order: a thread's bytes of a K step contiguous, the sign
bits where the e4m3 bytes want them; session 45). Given the reordered weights as b's data and the folded scales as
`folded`, the Gluon kernels of gemm_gluon_fp4_e4m3_kernel.py run the call: no activation pass, the conversion 7
instructions per 8 values (docs/reports/deepgemm-fp8-moe.md; H200, session 20 run 1, against the bf16 route: prefill
1.03-1.05x, decode at ~8 rows per expert 1.28-1.36x and 0.61 of the copy rate, at ~32 rows 0.85-0.87x). Its rows differ
from the bf16 route's by rounding and agree bitwise between the two layouts, so pass `folded` for a weight tensor in
every call or in none. `fold_fp4_weights` returns None on a CUDA device where no FP8-MMA kernel runs (the bf16 route
there): one without FP8 MMAs (before sm_89), or, off the Gluon route, with MINI_DEEPGEMM_TRITON_FP8_MOE=0
(_backend.triton_fp8_moe_enabled; the switch is on by default since session 76, docs/reports/triton-route-on-hopper.md).
Off the Gluon route the Triton kernel of gemm_fp4_e4m3_kernel.py takes the folded operands when the activations come
folded per 128 (the engine's form). Elsewhere (the CPU references, per-32 activations off the Gluon route,
backend="tilelang") a call with `folded` reads the weights back in the checkpoint's order (a copy per call), the same in
every layout.
With activations folded per 128 (sa float32 [..., K/128], powers of two: the values re-expressed under each 128
columns' largest UE8M0 scale, reference.fold_ue8m0_to_128) the route's K step is one 128-deep MMA chain and one fp32
FMA per element instead of four of each: 1.28-1.29x at prefill, 1.10-1.31x at decode (H200, session 21 run 2,
docs/reports/deepgemm-moe-fold-128.md). Every other route takes them as UE8M0 per 32 (each power of two repeated
four times: `reference.ue8m0_from_fold_128`, exact). A folded product differs from the per-32 one by the fold's
rounding (values under ~2^-6 of their 128 columns' largest scale).

V4.1 FP8 GEMMs on the V3 recipe's kernels: `fold_fp8_weight_scales(bq, sb)` (once per weight tensor, at load) and
`per_token_group_quant_fp8(x, 32, "ue8m0", fold_128=True)` give V4.1's quantized operands with power-of-two fp32
scales per 128 x 128 and 1 x 128 (reference.fold_ue8m0_to_128: values re-expressed under each block's largest
scale, exact but for values that fall below e4m3's normal range there); `fp8_gemm_nt` multiplies them as a V3-recipe
call, promoted every 128 of K instead of every 32 (docs/reports/deepgemm-v41-fold.md).

On CUDA, `default_config` picks the kernel per call: the Gluon kernels (gemm_gluon_fp8_kernel.py: dense FP8
weights, V3 and V4.1 recipes; gemm_gluon_kernel.py: grouped FP4 weights) where they run (sm_90, triton 3.6), else
the Triton kernels (gemm_swapab_kernel.py, gemm_kernel.py); the shape families where the TileLang kernels of
gemm_tilelang.py measured faster (`TILELANG_FAMILIES`, none so far) run there when tilelang is importable; without
CUDA or triton the pure-torch references in reference.py compute the same result (up to the order of fp32
additions).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import reference
from ._backend import (cdiv, gluon_runs_on, sm_count, tilelang_importable, triton_fp8_moe_enabled,
                       use_triton)

__all__ = [
    "V41_RECIPE", "V3_RECIPE", "FP4_RECIPE", "get_m_alignment_for_contiguous_layout",
    "fp8_gemm_nt", "fp8_fp4_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked",
    "FoldedFP4Scales", "fold_fp4_weights", "fold_fp8_weight_scales",
]

V41_RECIPE = (1, 32, 32)
V3_RECIPE = (1, 128, 128)
FP4_RECIPE = (1, 1, 32)
_M_ALIGNMENT = 128
_DENSE, _CONTIGUOUS, _MASKED = 0, 1, 2
_UE8M0_DTYPES = (torch.float8_e8m0fnu, torch.uint8)
Recipe = tuple[int, int, int]
FP8Operand = tuple[torch.Tensor, torch.Tensor]
# (layout, FP4 weights, UE8M0 scales) families routed to TileLang by default: those where its kernel beats the
# Triton kernel in bench_deepgemm.py --tilelang on H200. None so far (docs/reports/deepgemm-tilelang.md).
TILELANG_FAMILIES: frozenset[tuple[int, bool, bool]] = frozenset()


def get_m_alignment_for_contiguous_layout() -> int:
    """Row alignment of each expert segment in the contiguous grouped layout (a multiple of every tile height
    the kernel uses, so no tile straddles two experts)."""
    return _M_ALIGNMENT


def fp8_gemm_nt(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Recipe | None = None
) -> None:
    """d[M, N] = c + (a.q * sa) @ (b.q * sb)^T with FP8 weights; recipe V41_RECIPE or V3_RECIPE (see module)."""
    _gemm(_DENSE, a, b, d, c, None, recipe, allow_fp4=False)


def fp8_fp4_gemm_nt(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Recipe | None = None
) -> None:
    """As `fp8_gemm_nt`, and B may also be packed FP4 e2m1 [N, K/2] with UE8M0 scales [N, K/32]."""
    _gemm(_DENSE, a, b, d, c, None, recipe, allow_fp4=True)


def m_grouped_fp8_gemm_nt_contiguous(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, grouped_layout: torch.Tensor, recipe: Recipe | None = None
) -> None:
    """d[M, N]: row m = a[m] @ b[grouped_layout[m]]^T; b.q [G, N, K] FP8. Padding rows (-1) untouched."""
    _gemm(_CONTIGUOUS, a, b, d, None, grouped_layout, recipe, allow_fp4=False)


def m_grouped_fp8_fp4_gemm_nt_contiguous(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, grouped_layout: torch.Tensor, recipe: Recipe | None = None,
    *, weight_scale_max: int = 255, folded: FoldedFP4Scales | None = None, expected_m: int | None = None,
) -> None:
    """As `m_grouped_fp8_gemm_nt_contiguous`; b.q may be packed FP4 [G, N, K/2] with sb [G, N, K/32]. weight_scale_max:
    an upper bound on sb's bytes; folded: fold_fp4_weights(bq, sb)'s scales, for the FP8-MMA route, with b.q its
    reordered weights (module docstring). expected_m: the typical real rows per expert, a host-side hint for the FP8-MMA
    route's tile height (_contiguous_block_m); without it the route estimates them from M / G, which suits a layout of
    just the 128-aligned segments, not one of a fixed capacity (its spare rows would count as experts' rows)."""
    _gemm(_CONTIGUOUS, a, b, d, None, grouped_layout, recipe, allow_fp4=True, expected_m=expected_m,
          weight_scale_max=weight_scale_max, folded=folded)


def m_grouped_fp8_gemm_nt_masked(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    recipe: Recipe | None = None,
) -> None:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T; a.q [G, max_m, K], b.q [G, N, K] FP8, d [G, max_m, N]."""
    _gemm(_MASKED, a, b, d, None, masked_m, recipe, allow_fp4=False, expected_m=expected_m)


def m_grouped_fp8_fp4_gemm_nt_masked(
    a: FP8Operand, b: FP8Operand, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
    recipe: Recipe | None = None, *, weight_scale_max: int = 255, folded: FoldedFP4Scales | None = None,
) -> None:
    """As `m_grouped_fp8_gemm_nt_masked`; b.q may be packed FP4 [G, N, K/2] with sb [G, N, K/32].
    weight_scale_max: an upper bound on sb's bytes; folded: fold_fp4_weights(bq, sb)'s scales, for the FP8-MMA route,
    with b.q its reordered weights (module docstring)."""
    _gemm(_MASKED, a, b, d, None, masked_m, recipe, allow_fp4=True, expected_m=expected_m,
          weight_scale_max=weight_scale_max, folded=folded)


class FoldedFP4Scales(NamedTuple):
    """FP4 weight scales folded for the FP8-MMA route (fold_fp4_weights)."""

    offsets: torch.Tensor  # int32 [G, N, K / 128]: per weight row and 32-block, e - ref + 5 in [0, 11], 4 per word
    column_scales: torch.Tensor  # fp32 [G, N]: 2^(ref - 127), ref = the row's largest scale exponent - 6


# e2m1 x 2^d is exact in e4m3 for d in [-8, 6]; the kernels' two-word tables are exact for d in [-5, 6]
_FOLD_D_MIN, _FOLD_D_MAX = -5, 6


def fold_fp4_weights(bq: torch.Tensor, sb: torch.Tensor, out: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, FoldedFP4Scales] | None:
    """FP4 weights (packed e2m1 [G, N, K / 2], UE8M0 sb [G, N, K / 32], K % 128 == 0) in the FP8-MMA route's form: (the
    packed weights in the route's order, reference.fp4_to_fp8_mma_order, written into out: a contiguous tensor like bq,
    bq itself to reorder in place, None for a new one; the folded scales). Each weight row's values become e4m3 x 2^(e -
    ref) with ref = its largest scale exponent - 6, and 2^(ref - 127) scales its outputs. None (keep the bf16 route)
    when a row's scale bytes span more than 11, a ref would leave fp32's normal range, or bq sits on a CUDA device
    where the route's Gluon kernels do not run (every call would read the weights back there; not Hopper, or another
    triton). Pass the returned weights as b's data with `folded` in every call (the CPU references read them back in
    the checkpoint's order on each call: a copy of the weights). Once per weight tensor, at load: it reads every scale
    byte and syncs with the host; the reorder runs in chunks of rows (bounded temporaries), and only where the route
    applies (None leaves out untouched)."""
    _require(sb.dim() == 3 and sb.dtype in _UE8M0_DTYPES,
             lambda: f"sb must be UE8M0 [G, N, K/32], got {sb.dtype} {tuple(sb.shape)}")
    _require(sb.shape[-1] % 4 == 0, lambda: f"K = {32 * sb.shape[-1]} must be a multiple of 128")
    _require(bq.dim() == 3 and bq.dtype in (torch.uint8, torch.int8) and tuple(bq.shape) == (*sb.shape[:2],
             16 * sb.shape[-1]), lambda: f"bq must be packed FP4 {(*sb.shape[:2], 16 * sb.shape[-1])}, got "
             f"{bq.dtype} {tuple(bq.shape)}")
    if not _folds_on(bq):
        return None
    e = sb.view(torch.uint8).to(torch.int32)
    ref = e.amax(-1) - _FOLD_D_MAX
    d = e - ref[..., None]
    if not bool((d.amin() >= _FOLD_D_MIN) & (ref.amin() >= 1)):  # one host sync
        return None
    column_scales = torch.ldexp(torch.ones_like(ref, dtype=torch.float32), (ref - 127).to(torch.float32))
    offsets = (d - _FOLD_D_MIN).to(torch.uint8).contiguous().view(torch.int32)
    return reference.fp4_to_fp8_mma_order(bq, out), FoldedFP4Scales(offsets, column_scales)


def _folds_on(t: torch.Tensor) -> bool:
    """Whether fold_fp4_weights folds weights on t's device: on CPU (the references, which read the route's order
    back per call), where the route's Gluon kernels run, and with triton_fp8_moe_enabled on CUDA devices with FP8
    MMAs (gemm_fp4_e4m3_kernel); not elsewhere, where every call would read the weights back (the bf16 route there,
    as for weights whose scales do not fold)."""
    return not t.is_cuda or gluon_runs_on(t) or (triton_fp8_moe_enabled() and _fp8_mma_on(t))


def _fp8_mma_on(t: torch.Tensor) -> bool:
    """Whether t's CUDA device has FP8 tensor cores for Triton's FP8 dot (sm_89 and later)."""
    return t.is_cuda and use_triton(t) and torch.cuda.get_device_capability(t.device) >= (8, 9)


def fold_fp8_weight_scales(bq: torch.Tensor, sb: torch.Tensor) -> FP8Operand:
    """V4.1 FP8 weights (e4m3 [N, K], UE8M0 sb [N/32, K/32], N and K multiples of 128) in the V3 recipe's form:
    (e4m3 [N, K], fp32 [N/128, K/128] powers of two), reference.fold_ue8m0_to_128. Once per weight tensor, at load
    (no host sync; a temporary fp32 copy of the weights)."""
    _require(bq.dim() == 2 and bq.dtype == torch.float8_e4m3fn and sb.dtype in _UE8M0_DTYPES,
             lambda: f"fold_fp8_weight_scales takes e4m3 [N, K] weights with UE8M0 scales, got {bq.dtype} "
             f"{tuple(bq.shape)}, {sb.dtype}")
    return reference.fold_ue8m0_to_128(bq, sb, 32)


# --------------------------------------------------------------------------- validation
def _require(cond: bool, msg: str | Callable[[], str]) -> None:
    """Raise ValueError(msg) unless cond. A message built from the arguments comes as a lambda: these checks run on
    every call, and formatting shapes eagerly cost ~10 us of host time per GEMM (session 31)."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def _resolve_recipe(sa: torch.Tensor, sb: torch.Tensor, b_fp4: bool, recipe: Recipe | None) -> Recipe:
    ue8m0 = sa.dtype in _UE8M0_DTYPES
    _require(ue8m0 or sa.dtype == torch.float32,
             lambda: f"sa must be float8_e8m0fnu/uint8 (UE8M0) or float32, got {sa.dtype}")
    if b_fp4:  # sa float32: activations folded per 128 (module docstring)
        _require(sb.dtype in _UE8M0_DTYPES, lambda: f"FP4 weights need UE8M0 scales, got {sb.dtype}")
        _require(recipe in (None, FP4_RECIPE), lambda: f"FP4 weights use recipe {FP4_RECIPE}, got {recipe}")
        return FP4_RECIPE
    _require((sb.dtype in _UE8M0_DTYPES) == ue8m0 and (ue8m0 or sb.dtype == torch.float32),
             lambda: f"sa ({sa.dtype}) and sb ({sb.dtype}) must both be UE8M0 or both float32")
    if recipe is None:
        return V41_RECIPE if ue8m0 else V3_RECIPE
    _require(len(recipe) == 3 and recipe[0] == 1, lambda: f"recipe must be (1, gran_n, gran_k), got {recipe}")
    _require(recipe[2] in (32, 64, 128), lambda: f"gran_k must be 32, 64 or 128, got {recipe[2]}")
    _require(recipe[1] >= 1, lambda: f"gran_n must be >= 1, got {recipe[1]}")
    return tuple(recipe)


def _validate(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
              group_arg: torch.Tensor | None, recipe: Recipe | None, allow_fp4: bool) -> tuple[Recipe, bool]:
    (aq, sa), (bq, sb) = a, b
    _require(aq.dtype == torch.float8_e4m3fn, lambda: f"a must be float8_e4m3fn, got {aq.dtype}")
    b_fp4 = bq.dtype in (torch.uint8, torch.int8)
    if b_fp4:
        _require(allow_fp4, "packed FP4 weights need the fp8_fp4_* functions")
    else:
        _require(bq.dtype == torch.float8_e4m3fn,
                 lambda: f"b must be float8_e4m3fn or packed FP4 uint8/int8, got {bq.dtype}")
    a_dims, b_dims = (3, 3) if layout == _MASKED else (2, 3) if layout == _CONTIGUOUS else (2, 2)
    _require(aq.dim() == a_dims, lambda: f"a must be {a_dims}-D, got shape {tuple(aq.shape)}")
    _require(bq.dim() == b_dims, lambda: f"b must be {b_dims}-D, got shape {tuple(bq.shape)}")
    K, N = aq.shape[-1], bq.shape[-2]
    _require(bq.shape[-1] == (K // 2 if b_fp4 else K),
             lambda: f"b's last dim {bq.shape[-1]} does not match K={K}" + (" (packed FP4: K/2)" if b_fp4 else ""))
    gran_rows, gran_n, gran_k = recipe = _resolve_recipe(sa, sb, b_fp4, recipe)
    sa_gran_k = 128 if _folded_per_128(a, b_fp4) else gran_k
    _require(K % sa_gran_k == 0, lambda: f"K={K} is not a multiple of the scale granularity {sa_gran_k}")
    _require(tuple(sa.shape) == (*aq.shape[:-1], K // sa_gran_k),
             lambda: f"sa must be {(*aq.shape[:-1], K // sa_gran_k)}"
             + (" (float32 scales of activations folded per 128)" if sa_gran_k != gran_k else "")
             + f", got {tuple(sa.shape)}")
    _require(tuple(sb.shape) == (*bq.shape[:-2], cdiv(N, gran_n), K // gran_k),
             lambda: f"sb must be {(*bq.shape[:-2], cdiv(N, gran_n), K // gran_k)}, got {tuple(sb.shape)}")
    out_shape = (*aq.shape[:-1], N)
    _require(tuple(d.shape) == out_shape, lambda: f"d must be {out_shape}, got {tuple(d.shape)}")
    _require(d.dtype in (torch.bfloat16, torch.float32), lambda: f"d must be bfloat16 or float32, got {d.dtype}")
    for name, t in (("a", aq), ("b", bq), ("d", d)):
        _require(t.stride(-1) == 1, lambda: f"{name} must be contiguous in its last dim")
    if c is not None:
        _require(d.dtype == torch.float32 and c.dtype == torch.float32, "accumulating into c needs fp32 c and d")
        _require(c.shape == d.shape and c.stride() == d.stride(), "c must have d's shape and strides")
    if layout == _CONTIGUOUS:
        _require(group_arg.dtype == torch.int32 and tuple(group_arg.shape) == (aq.shape[0],),
                 lambda: f"grouped_layout must be int32 [{aq.shape[0]}], got {group_arg.dtype} "
                         f"{tuple(group_arg.shape)}")
        _require(bq.shape[0] == sb.shape[0], "b and sb must have the same number of groups")
    if layout == _MASKED:
        G = aq.shape[0]
        _require(bq.shape[0] == G and sb.shape[0] == G, lambda: f"a, b and sb must all have G={G} groups")
        _require(group_arg.dtype == torch.int32 and tuple(group_arg.shape) == (G,),
                 lambda: f"masked_m must be int32 [{G}], got {group_arg.dtype} {tuple(group_arg.shape)}")
    devices = {t.device for t in (aq, sa, bq, sb, d) + ((group_arg,) if group_arg is not None else ())}
    _require(len(devices) == 1, lambda: f"all tensors must be on one device, got {devices}")
    return recipe, b_fp4


def _folded_per_128(a: FP8Operand, b_fp4: bool) -> bool:
    """Whether a is an FP4 call's activations folded per 128 (float32 sa; module docstring)."""
    return b_fp4 and a[1].dtype == torch.float32


# --------------------------------------------------------------------------- dispatch
def _gemm(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
          group_arg: torch.Tensor | None, recipe: Recipe | None, allow_fp4: bool, expected_m: int | None = None,
          config: dict | None = None, backend: str | None = None, weight_scale_max: int = 255,
          folded: FoldedFP4Scales | None = None) -> None:
    """backend: None picks (TileLang for TILELANG_FAMILIES, else Triton, else the reference); "tilelang" or
    "triton" force one (tests and benchmarks; "tilelang" raises if the call is outside its coverage).
    weight_scale_max: the caller's bound on FP4 scale bytes; folded: the FP8-MMA route's scales (module
    docstring)."""
    _require(isinstance(weight_scale_max, int) and 0 <= weight_scale_max <= 255,
             lambda: f"weight_scale_max must be an int in [0, 255] (a bound on UE8M0 bytes), got {weight_scale_max!r}")
    _require(expected_m is None or (isinstance(expected_m, int) and expected_m >= 0),
             lambda: f"expected_m must be a non-negative int (rows per group, a host-side hint), got {expected_m!r}")
    recipe, b_fp4 = _validate(layout, a, b, d, c, group_arg, recipe, allow_fp4)
    if folded is not None:
        _validate_folded(layout, a, b, d, folded, b_fp4)
    if d.numel() == 0:
        return
    if folded is not None and backend is None and _gluon_runs_on(d):
        _fp4_e4m3_gemm(layout, a, b, d, group_arg, folded, expected_m)
        return
    if folded is not None and backend in (None, "triton") and _fp4_e4m3_triton_takes(a, d):
        _fp4_e4m3_triton_gemm(layout, a, b, d, group_arg, folded, expected_m)
        return
    if folded is not None:  # the other routes read the weights in the checkpoint's order
        b = (reference.fp4_from_fp8_mma_order(b[0]), b[1])
    if _folded_per_128(a, b_fp4):  # the other routes take the folded scales as UE8M0 per 32, exactly
        a = (a[0], reference.ue8m0_from_fold_128(a[1]))
    if backend == "tilelang" or (backend is None and _use_tilelang(layout, a, b, d, c, recipe, b_fp4)):
        from . import gemm_tilelang

        _require(_tilelang_covers(layout, a, b, d, c, recipe, b_fp4),
                 "this call is outside the TileLang kernels' coverage")
        gemm_tilelang.launch(layout, a, b, d, group_arg, recipe[1], recipe[2], b_fp4)
    elif use_triton(d):
        _launch(layout, a, b, d, c, group_arg, recipe, b_fp4, expected_m, config, b_fp4 and weight_scale_max <= 128)
    else:
        _reference(layout, a, b, d, c, group_arg, recipe)


def _tilelang_covers(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
                     recipe: Recipe, b_fp4: bool) -> bool:
    from . import gemm_tilelang

    contiguous = all(t.is_contiguous() for t in (a[0], b[0], d))
    K = a[0].shape[-1]
    return d.is_cuda and contiguous and gemm_tilelang.supports(layout, b_fp4, recipe[1], recipe[2], K, d, c)


def _use_tilelang(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
                  recipe: Recipe, b_fp4: bool) -> bool:
    ue8m0 = a[1].dtype in _UE8M0_DTYPES
    return ((layout, b_fp4, ue8m0) in TILELANG_FAMILIES and d.is_cuda and tilelang_importable()
            and _tilelang_covers(layout, a, b, d, c, recipe, b_fp4))


def _reference(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
               group_arg: torch.Tensor | None, recipe: Recipe) -> None:
    (aq, sa), (bq, sb) = a, b
    _, gran_n, gran_k = recipe
    if layout == _DENSE:
        out = reference.gemm_nt_ref(aq, sa, bq, sb, gran_n, gran_k)
        d.copy_(out if c is None else c + out)
    elif layout == _CONTIGUOUS:
        out = reference.m_grouped_gemm_nt_contiguous_ref(aq, sa, bq, sb, group_arg, gran_n, gran_k)
        rows = group_arg >= 0
        d[rows] = out[rows].to(d.dtype)
    else:
        out = reference.m_grouped_gemm_nt_masked_ref(aq, sa, bq, sb, group_arg, gran_n, gran_k)
        for g, m in enumerate(group_arg.tolist()):
            d[g, :m] = out[g, :m].to(d.dtype)


def default_config(layout: int, rows_hint: int, gran_k: int, ue8m0: bool, n: int = 0, groups: int = 1,
                   fp4: bool = False) -> dict:
    """Kernel, tile shape and pipeline depth, from the H200 measurements in docs/reports/deepgemm-scaling.md,
    deepgemm-swapab.md, deepgemm-fp4-ptx.md and deepgemm-masked-swapab.md.

    gemm_gluon_fp8_kernel's V4.1 kernel (GLUON_V41, where _use_gluon_v41 allows it; docs/reports/deepgemm-gluon-v41.md):
    dense GEMMs with FP8 weights at every row count, FP8 MMAs promoted every 32 of K. Session 12 run 2 (H200):
    1.30-2.61x the swap-AB kernel at M = 4,096 on the 8 dense shapes, 1.6-3.9x at M = 1-64. Every tile shape it
    runs computes a row the same way, so a row's result does not depend on M (the tiles below, its fallback,
    have the same property among themselves, on bf16 MMAs). Tiles: _gluon_v41_tile; up to 64 rows, where
    _splitk_runs picks it, the split-K kernel (gemm_gluon_fp8_splitk_kernel: the same K slices, the same bits).

    gemm_gluon_kernel (GLUON, where _use_gluon allows it; the same products and order as the swap-AB kernel, the
    weights converted in the MMA's register layout; docs/reports/deepgemm-gluon.md), FP4 weights only:
    - contiguous at more than 48 rows per group: the warp-specialized kernel (GLUON_WS; 256 weight rows x 128
      tokens, persistent, 4 stages). At 128-1,024 rows per expert it runs 1.15-1.20x the one-warpgroup 128 x 128
      kernel (session 13 runs 2 and 3), which was 1.03-1.15x the swap-AB kernel (four runs). At 32-96 rows per
      expert (the 1-GPU prefill) it runs 1.25-1.31x the swap-AB kernel's 128 x 64 tiles, though half of each
      128-token tile there is padding (session 13 run 5: 263-267 against 201-214 TFLOP/s). Its 64-token tiles ran
      191-196 and the one-warpgroup 64 x 128 tile 227. At 48 rows per group or fewer (not measured) the padding share
      grows, so those stay on the swap-AB kernel;
    - masked, after an activation pass over the used rows: 1.05-1.30x the swap-AB kernel's in-tile dequantization
      at 8 and 32 rows per expert (session 9, 16- and 32-token tiles, 4 stages). Since session 13, 17-32 expected
      rows take 64-token tiles at 3 stages, 1.13-1.17x the 32-token tiles at 32 rows per expert: each expert's
      weights are read once (run 7; at 8 rows the 16-token tile stays best: 1,638-1,676 GB/s against 1,392-1,400
      for 64 tokens). The swap-AB fallback takes the same tile there, which was not measured.
    Elsewhere (another triton release or GPU, the interpreter, an fp32 output, an unaligned scale tensor) the same
    config runs the swap-AB kernel.

    gemm_swapab_kernel (SWAP_AB: weights dequantized in registers as the MMA's left operand, bf16 MMAs):
    - UE8M0 scales in the contiguous layout: 128 weight rows x 128 tokens, one warpgroup; with at most 96 rows
      per group, 128 x 64 (a weight tile is converted for a token tile it fills, all-padding tiles are skipped):
      5.4 against 6.1 (128 x 128) and 6.7 ms (64 x 64) for the FP4 w13 GEMM at 1-GPU routing (64 rows per
      expert); at 1,024 rows per expert 128 x 128 is 1.35x faster than 128 x 64. Rows per group are estimated
      without a device read as (rows - groups x (alignment - 1)) / groups: exact for the runtime's fixed-size
      layouts (moe.max_rows), a lower bound for an exactly sized one;
    - few tokens (the masked layout, hinted by expected_m; dense GEMMs of at most 32 rows, with FP4 weights of
      at most 1,023): the activations dequantized in the tile (X_FP8), no activation pass; 16 tokens per tile up
      to 16 rows (against 64 weight rows when dense, for more programs on narrow N; 128 when masked), else 32 or
      64 x 128. Masked FP4
      at 1-8 rows per expert: 2.0-2.3x gemm_kernel's 64-row tiles; dense FP8 at M <= 32 up to 2x; at M = 64
      gemm_kernel's 64-row tiles are as fast or faster;
    - dense with M >= 1024: 128 weight rows x 256 tokens (128 below 2,048 rows or at N < 4,096), two warpgroups;
      1.18-1.35x gemm_kernel at N >= 4,608, and since the session-5 scale handling also 1.2-1.33x at wq_a, wkv and
      the indexer's wq_b (0.19 / 0.087 / 0.110 against 0.24 / 0.105 / 0.146 ms at M = 4,096);
    - FP4 weights always (also where gemm_kernel would be as fast): FP4 products are summed per 64-block as
      [32 even | 32 odd] columns here and in natural order in gemm_kernel, so one kernel for every FP4 shape keeps
      a row's result independent of the batch that carries it (test_ue8m0_results_do_not_depend_on_the_batch).
    SCALE_WORDS (the scales as 32-bit words, which Triton pipelines): 1.1-1.4x on every FP4 and few-token tile;
    the two-warpgroup FP8 tiles ran 0.85-0.95x with it (0.56 against 0.50 ms for shared_w13), so they keep byte
    loads.
    gemm_kernel otherwise (`gemm_kernel_config`).
    """
    if not ue8m0:
        return gemm_kernel_config(layout, rows_hint, gran_k, ue8m0)
    if layout == _DENSE and not fp4:
        return {**_ue8m0_config(layout, rows_hint, gran_k, n, groups, fp4), "GLUON_V41": True}
    return _ue8m0_config(layout, rows_hint, gran_k, n, groups, fp4)


def _ue8m0_config(layout: int, rows_hint: int, gran_k: int, n: int, groups: int, fp4: bool) -> dict:
    """default_config's tiles for UE8M0 scales on the Triton kernels (see there)."""
    swapab = dict(GROUP_M=8, num_warps=4, num_stages=4, SUBS=1, BF16_MMA=True, SWAP_AB=True, SCALE_WORDS=True)
    if layout == _CONTIGUOUS:
        rows = rows_hint - groups * (_M_ALIGNMENT - 1)  # a lower bound of the real rows (see default_config)
        few_rows = rows <= 96 * groups
        # FP4 above 48 rows per group: the warp-specialized Gluon kernel (its own 128-token tiles) where _use_gluon
        # allows it, else the swap-AB kernel at BLOCK_M
        gluon_ws = dict(GLUON=True, GLUON_WS=True, GLUON_STAGES=4) if fp4 and rows > 48 * groups else {}
        return dict(swapab, BLOCK_M=64 if few_rows else 128, BLOCK_N=128, **gluon_ws)
    if layout == _MASKED and fp4 and 16 < rows_hint <= 32:
        # one 64-token tile holds an expert's Poisson(32) rows (at most ~50), so each expert's weights stream once
        # where two 32-token tiles read them twice (session 13 run 7: 1,301-1,304 against 1,112-1,150 GB/s)
        return dict(swapab, BLOCK_M=64, BLOCK_N=128, X_FP8=True, GLUON=True, GLUON_STAGES=3)
    if layout == _MASKED or rows_hint <= 32:
        # masked FP4 at the measured 16-token tile: the Gluon kernel where _use_gluon allows it
        gluon = dict(GLUON=True, GLUON_STAGES=4) if layout == _MASKED and fp4 and rows_hint <= 32 else {}
        if rows_hint <= 16:
            return dict(swapab, BLOCK_M=16, BLOCK_N=64 if layout == _DENSE else 128, X_FP8=True, **gluon)
        return dict(swapab, BLOCK_M=32 if rows_hint <= 32 else 64, BLOCK_N=128, X_FP8=True, **gluon)
    if rows_hint >= 1024:
        wide = n >= 4096
        return dict(swapab, BLOCK_M=256 if wide and rows_hint >= 2048 else 128, BLOCK_N=128, num_warps=8,
                    num_stages=3 if wide else 4, SCALE_WORDS=fp4)
    if fp4:  # 33-1,023 rows
        return dict(swapab, BLOCK_M=64, BLOCK_N=128, X_FP8=True)
    return gemm_kernel_config(layout, rows_hint, gran_k, True)


def gemm_kernel_config(layout: int, rows_hint: int, gran_k: int, ue8m0: bool) -> dict:
    """gemm_kernel's tiles (docs/reports/deepgemm-scaling.md, bench_deepgemm.py --sweep).

    - Few rows (decode; masked groups hinted by expected_m, dense M <= 64): 16/32/64-row tiles, so a weight
      tile is read once and little of the MMA is wasted on empty rows. UE8M0 scales (reached here only where
      swap-AB does not apply: accumulate-into, K % 128 != 0, a recipe other than V4.1's) instead take 64-row
      tiles with bf16 MMAs: every UE8M0 path then runs Hopper's warpgroup MMA (Triton uses the older mma.sync
      below 64 rows, whose sums round differently) on the same bf16 operands in the same K order, so a row's
      result does not depend on how many rows share its GEMM (batch-invariant: data-parallel ranks and
      recomputation after preemption see other batches).
    - UE8M0 scales (V4.1): 128x128 tiles, bf16-dequant MMAs; 32 of K per step for dense GEMMs, 128 per step
      for the grouped ones.
    - fp32 scales (V3 recipe): 64x128 tiles, one warpgroup, FP8 MMAs promoted every 128 of K; smaller CTAs
      let two or three of them share an SM and hide each other's promotion.
    """
    if layout != _CONTIGUOUS and rows_hint <= 64:
        if ue8m0:
            return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4, BF16_MMA=True)
        return dict(BLOCK_M=_token_tile(rows_hint), BLOCK_N=128, BLOCK_K=gran_k, GROUP_M=8, num_warps=4, num_stages=6,
                    BF16_MMA=False)
    if not ue8m0:
        # dense V3 recipe: gemm_gluon_fp8_kernel where _use_gluon_v3 allows it (the tile below is the fallback)
        gluon = dict(GLUON=True, GLUON_BLOCK_M=128, GLUON_STAGES=4, GLUON_PROGRAMS_PER_SM=1) if layout == _DENSE else {}
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=gran_k, GROUP_M=8, num_warps=4, num_stages=4, BF16_MMA=False,
                    **gluon)
    block_k = 32 if layout == _DENSE else 128
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k, GROUP_M=8, num_warps=8, num_stages=4, BF16_MMA=True)


def _launch_swapab(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, group_arg: torch.Tensor | None,
                   b_fp4: bool, cfg: dict) -> None:
    """The V4.1 (UE8M0) GEMMs on bf16 MMAs: gemm_gluon_kernel for the FP4 grouped GEMMs where _use_gluon allows it,
    gemm_swapab_kernel otherwise. The activations reach the MMAs as bf16 either from one pass beforehand
    (_dequant_activations; FP4 weights: K permuted per 64-block) or, with cfg["X_FP8"] (the swap-AB kernel's masked
    layout always), dequantized per tile inside the swap-AB kernel; both give the same values in the same K order.
    Needs UE8M0 scales per 32 of K (FP8 weights: 32x32 blocks), K % 128 == 0 (the kernels load 4 scales per word)
    and no accumulate-into (checked by _launch)."""
    (aq, sa), (bq, sb) = a, b
    if _use_gluon(layout, b_fp4, d, bq, sb, cfg):
        if layout == _MASKED:
            x = _dequant_masked_rows(aq, sa, group_arg)
        else:
            x = _dequant_activations(aq, sa, True, grouped_layout=group_arg)
        _gluon_fp4_grouped_gemm(layout, x, bq, sb, d, group_arg, cfg)
    elif cfg.get("X_FP8", False) or layout == _MASKED:
        _swapab_gemm(aq, sa, bq, sb, d, layout, group_arg, b_fp4, cfg)
    else:
        x = _dequant_activations(aq, sa, b_fp4, grouped_layout=group_arg if layout == _CONTIGUOUS else None)
        _swapab_gemm(x, None, bq, sb, d, layout, group_arg, b_fp4, cfg)


def _gluon_runs_on(d: torch.Tensor) -> bool:
    """Where the Gluon GEMMs run: a bf16 output where _backend.gluon_runs_on allows."""
    return d.dtype == torch.bfloat16 and gluon_runs_on(d)


def _validate_folded(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, folded: FoldedFP4Scales,
                     b_fp4: bool) -> None:
    """What the FP8-MMA route needs besides _validate's checks. Checked everywhere, so that a call never takes
    another route (other bits) on one machine than on another for a reason the caller could have seen."""
    (aq, sa), (bq, _) = a, b
    _require(b_fp4 and layout != _DENSE, "folded FP4 scales are for the grouped fp8_fp4_* GEMMs with packed FP4 "
             "weights")
    G, N, K = bq.shape[0], bq.shape[1], aq.shape[-1]
    _require(N % 128 == 0 and K % 128 == 0,
             lambda: f"the FP8-MMA route needs N and K multiples of 128, got N={N}, K={K}")
    _require(tuple(folded.offsets.shape) == (G, N, K // 128) and folded.offsets.dtype == torch.int32,
             lambda: f"folded.offsets must be int32 {(G, N, K // 128)}, got {folded.offsets.dtype} "
             f"{tuple(folded.offsets.shape)}")
    _require(tuple(folded.column_scales.shape) == (G, N) and folded.column_scales.dtype == torch.float32,
             lambda: f"folded.column_scales must be float32 {(G, N)}, got {folded.column_scales.dtype} "
             f"{tuple(folded.column_scales.shape)}")
    _require(all(t.is_contiguous() for t in (aq, sa, bq, d, *folded)),
             "the FP8-MMA route needs contiguous a, sa, b, d and folded scales")
    _require(d.dtype == torch.bfloat16, lambda: f"the FP8-MMA route writes bf16, got d {d.dtype}")


def _packed_fp4_desc(bq: torch.Tensor, steps: int = 1):
    """_tma_desc of the FP8-MMA route's packed weights (uint8 [G, N, K / 2]) in [128 rows, 64 bytes] boxes, or with
    steps > 1 in [steps, 128, 64] boxes of a 3-D view, K step outermost (a masked ring slot of `steps` K steps). The
    default layout of 64-byte rows is a 64-byte swizzle, which the kernels assume: the converter's row-per-thread
    16-byte loads hit distinct banks. int8 storage (the runtime's) is read as uint8: the copies move bytes.
    Built per call (~4 us of host time; its shared layout is cached, _nvmma_layout): cached per weight tensor, the
    descriptor (which references its tensor) kept every model's expert weights alive after the model was dropped."""
    bq = bq.view(torch.uint8)
    G, N, K2 = bq.shape
    if steps == 1:
        return _tma_desc(bq.view(G * N, K2), (128, 64))
    return _tma_desc(bq.view(G * N, K2 // 64, 64).transpose(0, 1), (steps, 128, 64))


def _fp4_e4m3_triton_takes(a: FP8Operand, d: torch.Tensor) -> bool:
    """Where gemm_fp4_e4m3_kernel takes a folded call, once triton_fp8_moe_enabled: activations folded per 128 (its
    loop has no per-32 form), a bf16 output, on a GPU with FP8 MMAs or under the interpreter."""
    return (triton_fp8_moe_enabled() and _folded_per_128(a, True) and d.dtype == torch.bfloat16
            and (_fp8_mma_on(d) if d.is_cuda else use_triton(d)))


# Tiles of gemm_fp4_e4m3_kernel (weight rows x tokens): contiguous segments are 128-row aligned, so a token tile
# divides 128; masked tiles follow the expected rows per expert (16 tokens up to ~16 rows, 32 up to ~32, else 64).
# The best of benchmarks/exp_moe_triton_fp8.py's sweep (H100, session 75 run 1): the contiguous 256 x 64 tile ran
# 344 / 369 TFLOP/s at 96 experts of 128-1,024 rows (w13 / w2; the 128 x 128 tile of session 74 286 / 326) and
# 223 / 235 at 384 of 32-96; the 32-token masked tile 0.43 / 0.44 of the copy at ~32 rows at 3 stages (0.35 / 0.41
# at 4). No spills under triton 3.6 or 3.9 (sm_90; integration_tests/test_compile_sm90_deepgemm.py).
FP4_E4M3_TRITON_CONTIGUOUS = {"BLOCK_N": 256, "BLOCK_M": 64, "num_warps": 8, "num_stages": 3}
FP4_E4M3_TRITON_MASKED = {
    16: {"BLOCK_N": 128, "BLOCK_M": 16, "num_warps": 4, "num_stages": 4},
    32: {"BLOCK_N": 128, "BLOCK_M": 32, "num_warps": 4, "num_stages": 3},
    64: {"BLOCK_N": 128, "BLOCK_M": 64, "num_warps": 4, "num_stages": 3}}


def _fp4_e4m3_triton_gemm(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, group_arg: torch.Tensor,
                          folded: FoldedFP4Scales, expected_m: int | None) -> None:
    """gemm_fp4_e4m3_kernel's launch (operands checked by _validate_folded; activations folded per 128): one program
    per tile of the table's BLOCK_N weight rows x BLOCK_M tokens, and per expert in the masked layout."""
    from .gemm_fp4_e4m3_kernel import fp4_e4m3_gemm_kernel

    (aq, sa), (bq, _) = a, b
    N = bq.shape[1]
    M, K = aq.shape[-2:]
    masked = layout == _MASKED
    if masked:
        rows = expected_m if expected_m is not None else M
        cfg = FP4_E4M3_TRITON_MASKED[16 if rows <= 16 else 32 if rows <= 32 else 64]
    else:
        cfg = FP4_E4M3_TRITON_CONTIGUOUS
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    fp4_e4m3_gemm_kernel[(tiles, aq.shape[0]) if masked else (tiles,)](
        aq, sa, bq, folded.offsets, folded.column_scales, d, group_arg, M, N, K,
        aq.stride(0) if masked else 0, aq.stride(-2), sa.stride(0) if masked else 0, sa.stride(-2), K // 2,
        d.stride(0) if masked else 0, d.stride(-2),
        LAYOUT=layout, ASM=d.is_cuda, GROUP_M=8, enable_fp_fusion=True, **cfg)


def _fp4_e4m3_gemm(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, group_arg: torch.Tensor,
                   folded: FoldedFP4Scales, expected_m: int | None) -> None:
    """gemm_gluon_fp4_e4m3_kernel's launches (operands checked by _validate_folded): the contiguous kernel
    persistent on 128 x 128 tiles; the masked kernel per 128 weight rows, expert and token tile, with the token tile
    ring depth and register cap of _masked_tile(expected_m, folded activations), a split's two launches
    (_masked_launches) on two streams (MASKED_SPLIT_SIDE_STREAM) joined before the return.
    Activations folded per 128 (float32 sa) take the kernels' SA_PER_128 loop."""
    from .gemm_gluon_fp4_e4m3_kernel import (contiguous_tile_table_kernel, fp4_e4m3_contiguous_kernel,
                                             fp4_e4m3_masked_kernel)

    (aq, sa), (bq, _) = a, b
    G, N, _ = bq.shape
    K = aq.shape[-1]
    sa_per_128 = _folded_per_128(a, True)
    sa_words = sa if sa_per_128 else sa.view(torch.uint8).view(torch.int32)
    rows_hint = _contiguous_rows(aq.shape[0], G, expected_m) if layout == _CONTIGUOUS else expected_m or aq.shape[1]
    if layout == _CONTIGUOUS and not _contiguous_swapab(rows_hint, sa_per_128):
        M = aq.shape[0]
        block_m = _contiguous_block_m(rows_hint, sa_per_128)
        # 128-row tiles on folded activations take two feeder warpgroups in place of the producer warp and one
        # converter (session 70: 1.03x at ~64 rows; per-32 activations spilled in the math warpgroups' K loop with
        # them, and the 256-row tiles' math warpgroups leave them too few registers). Registers (per thread of a
        # warpgroup, 512 in all): 128-row tiles: each math warpgroup 200 (with 192 the TMA-store epilogue spilled 28
        # bytes), and each of the two feeders 56, or the producer warp 24 and the converter the 88 left; 256-row
        # tiles: the producer warp 24, each math warpgroup 216 (two accumulators and the MMA's part: 192; offline no
        # spills in the K loop, ~40 spill instructions in a tile's set-up and epilogue, more at 208), the converter
        # the 56 left (no spills). Shared memory: 4 stages of 48 KB (the feeders: of 32 KB, and 8 of 8 KB of packed
        # weights), or 3 of 56 KB; 32 KB of epilogue buffers.
        feeders = block_m == 128 and sa_per_128
        consumer_regs, producer_regs, stages = (216, 24, 3) if block_m == 256 else (200, 56 if feeders else 24, 4)
        table = group_arg  # 128-row tiles: unused
        if block_m == 256:  # the tiles start at each expert's first row; their count stays on the device
            table = torch.empty(1 + cdiv(M, 128), dtype=torch.int32, device=d.device)
            # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
            # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
            contiguous_tile_table_kernel[(1,)](group_arg, table, M, CHUNK=1024, num_warps=4, enable_fp_fusion=True)
        fp4_e4m3_contiguous_kernel[(min(cdiv(M, 128) * cdiv(N, 128), sm_count(d.device)),)](
            _tma_desc(aq, (block_m, 128)), _packed_fp4_desc(bq), _tma_desc(d, (64, 128)), d, folded.offsets, sa_words,
            folded.column_scales, table, group_arg, M, N, K, K // 128, d.stride(0), STAGES=stages, GROUP_M=8,
            CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs, SA_PER_128=sa_per_128, FEEDERS=feeders,
            num_warps=4, maxnreg=128, enable_fp_fusion=True)
        return
    # the swap-AB kernel: masked groups of max_m rows, or a contiguous layout's 128-row blocks (CONTIGUOUS)
    contiguous = layout == _CONTIGUOUS
    x_rows = aq.numel() // K
    max_m = 128 if contiguous else aq.shape[1]
    blocks = cdiv(x_rows, 128) if contiguous else G
    d_strides = (128 * d.stride(0), d.stride(0)) if contiguous else (d.stride(0), d.stride(1))
    launches = _masked_launches(_masked_tile(rows_hint, sa_per_128))
    side = _side_stream(d.device) if MASKED_SPLIT_SIDE_STREAM and len(launches) > 1 else None
    if side is not None:
        stream = torch.cuda.current_stream(d.device)
        side.wait_stream(stream)
    for i, (tile, min_rows, max_rows) in enumerate(launches):
        # a ring slot of k_per_slot K steps takes 3-D views, K step outermost, and boxes of that depth
        steps = tile.k_per_slot if (K // 128) % tile.k_per_slot == 0 else 1
        w_slot = _packed_fp4_desc(bq, steps)
        if steps == 1:
            x_slot = _tma_desc(aq.view(x_rows, K), (tile.tokens, 128))
        else:
            x_slot = _tma_desc(aq.view(x_rows, K // 128, 128).transpose(0, 1), (steps, tile.tokens, 128))
        with torch.cuda.stream(side if i == 1 else None):  # a split's wide launch beside its narrow one (None: no-op)
            fp4_e4m3_masked_kernel[(1 if tile.one_program else cdiv(max_m, tile.tokens), N // 128, blocks)](
                w_slot, x_slot, d, folded.offsets, sa_words, folded.column_scales, group_arg, min_rows, max_rows,
                max_m, N, K, K // 128, *d_strides, x_rows, STAGES=tile.stages, SA_PER_128=sa_per_128,
                SLOT_UNROLLED=tile.slot_unrolled, CONTIGUOUS=contiguous, num_warps=4,
                **({"maxnreg": tile.maxnreg} if tile.maxnreg else {}), enable_fp_fusion=True)
    if side is not None:
        stream.wait_stream(side)


# A split's two launches (_masked_launches) on two streams: the wide launch's programs fill the SMs the narrow
# launch's last wave leaves idle, and the two kernels share SMs (two 32-token CTAs and one 64-token CTA fit one SM's
# registers), instead of the wide launch starting when the narrow one has drained. The launches write disjoint
# experts' rows of d, so the bits are the same. H100, session 53 runs 1 and 3 (fraction of the copy rate, w13 / w2):
# ~16 rows 0.824 / 0.824-0.825 against 0.788-0.789 / 0.798-0.800 in series, ~32 rows 0.711-0.712 / 0.683-0.687
# against 0.693-0.696 / 0.653-0.663 (docs/reports/deepgemm-moe-fold-128.md, "Session 53").
MASKED_SPLIT_SIDE_STREAM = True


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """A second stream on `device` for the masked split's wide launch (MASKED_SPLIT_SIDE_STREAM), made once."""
    return torch.cuda.Stream(device)


def _contiguous_rows(M: int, groups: int, expected_m: int | None) -> int:
    """Real rows per expert of a contiguous call, the FP8-MMA route's tile hint: the caller's expected_m, else M /
    groups less 64, the average padding of 128-aligned segments (host arithmetic, no device read); at least 1."""
    return max(1, expected_m if expected_m is not None else M // groups - 64)


# Real rows per expert up to which a contiguous call on folded activations takes the swap-AB kernel (the masked
# kernel over the layout's 128-row blocks, its token tile and split from _masked_tile) instead of the contiguous
# kernel, whose time below ~64 rows is set by its per-step chain of each 128 x 128 tile, not by the rows. H100,
# session 54 runs 2 and 5, against the contiguous kernel (384 experts, w13 / w2, bitwise equal): 1.28-1.30x /
# 1.27-1.28x at ~16 rows, 1.15x / 1.11x at ~32, 0.90-0.91x / 0.85-0.86x at ~64, 0.67-0.85x from ~96; prefill step of
# three layers at 2,048 / 1,024 tokens 1.035-1.039x / 1.066x (docs/reports/deepgemm-moe-fold-128.md, "Session 54").
# At ~48 rows (the 64-token tile): 1.055x / 0.996x (H100, session 55 run 3), 1.054x / 1.021x (H200, session 56
# run 1); so the threshold sits between ~48 and ~64 (session 56).
CONTIGUOUS_SWAPAB_MAX_ROWS = 48


def _contiguous_swapab(rows: int, sa_per_128: bool) -> bool:
    """Whether a contiguous call of `rows` real rows per expert (_contiguous_rows) takes the swap-AB kernel."""
    return sa_per_128 and rows <= CONTIGUOUS_SWAPAB_MAX_ROWS


def _contiguous_block_m(rows: int, sa_per_128: bool) -> int:
    """Rows of the FP8-MMA contiguous kernel's tiles at `rows` real rows per expert (_contiguous_rows): 256 on
    activations folded per 128 from _BLOCK_M_256_MIN_ROWS rows, else 128. A 256-row tile converts each weight tile
    once for twice the rows, but an expert of an odd number of 128-row blocks ends in a tile of 128
    (docs/reports/deepgemm-moe-fold-128.md, sessions 38 and 39)."""
    return 256 if sa_per_128 and rows >= _BLOCK_M_256_MIN_ROWS else 128


# H200, 256-row tiles against 128 in the same run (exp_moe_tile_table, tiles cut at each expert; session 39 runs 2-5),
# w13 / w2, real rows per expert (and M / groups): 1.09-1.12x / 1.09-1.11x at 96 experts of 128-1,024 (~576; 613),
# 1.05-1.08x / 1.06-1.09x at 96 of 192-320 (EP4's ~256; ~315), 1.05-1.07x / 1.06-1.08x at 96 of 96-288 (~192; ~243),
# 1.05-1.08x / 1.01-1.02x at 192 of 64-192 (EP2's ~128; ~195), 0.78-0.80x / 0.82-0.85x at 384 of 32-96 (one GPU's
# ~64; 128); so from 128 real rows (64-128 not measured)
_BLOCK_M_256_MIN_ROWS = 128


def _token_tile(rows: int) -> int:
    """The token tile (16, 32 or 64) of the kernels whose tokens are an MMA's N (swap-AB: the masked and split-K
    kernels, gemm_kernel's few-row configs): the smallest that holds `rows`, 64 above."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


_INT32_MAX = 2**31 - 1


class MaskedTile(NamedTuple):
    """The FP8-MMA masked kernel's launch: tokens per tile, ring stages, register cap (None: the compiler's),
    whether one program per expert and 128 weight rows loops over the expert's token tiles (the grid's first axis
    1) instead of one program per tile (that axis cdiv(max_m, tokens), most of whose programs exit at once where
    experts have few rows), whether the experts above `tokens` rows go to a second launch (_masked_launches), and on
    folded activations the K steps a ring slot holds (1 where they do not divide K / 128) and whether they are
    unrolled (_masked_ring_slot)."""
    tokens: int
    stages: int
    maxnreg: int | None
    one_program: bool
    split: bool = False
    k_per_slot: int = 1
    slot_unrolled: bool = True


def _masked_launches(tile: MaskedTile) -> list[tuple[MaskedTile, int, int]]:
    """The masked kernel's launches for `tile`, each (tile, min_rows, max_rows): one for every expert, or with
    tile.split two, the experts of at most tile.tokens rows on one program each and the others on tiles twice as
    wide. A tile of T tokens takes an expert of T + 1 .. 2T rows in two passes, each converting the expert's weights;
    at ~32 rows per expert (Poisson) about 45% of the experts have more than 32. H200, session 50 run 2 (96 experts,
    fraction of the copy rate, w13 / w2): at ~32 rows 0.524 / 0.491 against one launch of 32 tokens 0.453 / 0.441 and
    of 64 tokens 0.461 / 0.439; at ~16 rows 0.683 / 0.652 against 0.604 / 0.578 (16 tokens) and 0.633 / 0.610 (32);
    bitwise equal (docs/reports/deepgemm-moe-fold-128.md, "Session 50")."""
    if not tile.split:
        return [(tile, 0, _INT32_MAX)]
    wide = 2 * tile.tokens
    return [(tile._replace(one_program=True, split=False), 0, tile.tokens),
            (MaskedTile(wide, tile.stages, _masked_register_cap(wide, True), False, False,
                        *_masked_ring_slot(wide, False)),
             tile.tokens + 1, _INT32_MAX)]


def _masked_register_cap(tokens: int, folded_activations: bool) -> int | None:
    """maxnreg of the masked kernel's tiles of 16-64 tokens (_masked_tile has the measurements): 128 on the folded
    loop up to 32 tokens (4 CTAs per SM), else the compiler's."""
    return 128 if folded_activations and tokens <= 32 else None


def _masked_ring_slot(tokens: int, split: bool) -> tuple[int, bool]:
    """(K steps per ring slot, whether a slot's steps are unrolled) of the folded masked loop at `tokens` per tile:
    two unrolled steps on tiles of at most 16 tokens that are not split (one GPU's decode, up to ~8 rows per expert),
    else one. Two steps per slot (MaskedTile.k_per_slot = 2) bring each refill, its handshakes and the CTA barriers
    the compiler puts around the copies once per two steps. H200, session 52 run 1 (fraction of the copy rate, w13 /
    w2, bitwise equal), two unrolled against one step: 0.934 / 0.953 against 0.920 / 0.912 at ~1 row (8 tokens),
    0.899 / 0.925 against 0.888 / 0.885 at ~4, 0.825 / 0.829 against 0.805 / 0.786 at ~8 (16 tokens); with the split
    (~16, ~32 rows) and at ~64, 0.94-1.01x, so one step there. Offline (triton 3.6, sm_90a, w13), instructions per
    warp and K step at 8 / 16 / 32 / 64 tokens: one step 284 / 300 / 322 / 367; two unrolled 242 / 252 / 290 (56
    bytes of stack at the 128-register cap) / 325; two in a loop 264.5 / 278.5 / 304 / 351.5
    (docs/reports/deepgemm-moe-fold-128.md, "Session 52"; benchmarks/exp_moe_masked_tiles.py measures them)."""
    return (2, True) if tokens <= 16 and not split else (1, True)


def _masked_tile(expected_m: int, folded_activations: bool) -> MaskedTile:
    """The masked kernel's launch for ~expected_m rows per expert. Tokens: session 19 (per-32 activations) picked 16
    up to ~16 rows per expert and 32 above; session 21 run 3 (folded activations, benchmarks/exp_moe_masked_tiles.py)
    kept them and found 64 best at ~64 rows: 0.256-0.270 of the copy rate against 0.218-0.231 (at ~32: 1.01-1.02x,
    within noise, so 32 stays there). Session 44 run 1: on folded activations up to ~4 rows (one GPU's decode: 384
    experts of ~1 / 2 / 4 rows), 8 tokens (m64n8k32 MMAs, half the tensor work and promotions of 16 tokens) ran
    1.03-1.08x, bitwise equal; at ~8 rows 0.78-0.80x (a second tile converts the weights again). Stages: 2 (session
    19 runs 9-10, 16 tokens per 32: fewer stages, more resident CTAs; session 22 run 2, folded: 3 and 4 stages slower
    or equal at every tile and ~8 / 32 / 64 rows). Register cap (folded, up to 32 tokens): 128, 4 CTAs per SM; 96 at
    8 tokens (95 registers, no stack offline: 5 CTAs, 1.00-1.01x). One program per expert (session 44 run 2, at the
    engine's capacity of one row per token of the batch): 8 tokens at ~1 / 2 / 4 rows 0.99-1.04x / 1.02-1.06x /
    1.04-1.11x, 16 tokens at ~8 rows 1.01-1.03x. Not at ~16 rows and more, where many experts take two tiles: a
    program's second tile would read the weights again, while programs per tile run side by side and share them
    through L2. Split (folded, 16- and 32-token tiles, session 50): the experts above the tile on a second launch
    of twice its tokens (_masked_launches)."""
    if folded_activations and expected_m <= 4:
        return MaskedTile(8, 2, 96, True, False, *_masked_ring_slot(8, False))
    tokens = _token_tile(expected_m)
    split = folded_activations and expected_m > 8 and tokens <= 32
    return MaskedTile(tokens, 2, _masked_register_cap(tokens, folded_activations), expected_m <= 8, split,
                      *(_masked_ring_slot(tokens, split) if folded_activations else (1, True)))


def _use_gluon(layout: int, b_fp4: bool, d: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor,
               cfg: dict) -> bool:
    """gemm_gluon_kernel covers what default_config marks GLUON (FP4 weights, grouped layouts) where _gluon_runs_on
    allows it; it reads the scales as 32-bit words, so their base must be 4-byte aligned, and the warp-specialized
    contiguous kernel (GLUON_WS) copies the weights by TMA: a contiguous, 16-byte aligned bq."""
    tma_ok = not cfg.get("GLUON_WS") or (bq.is_contiguous() and bq.data_ptr() % 16 == 0)
    return (bool(cfg.get("GLUON")) and b_fp4 and layout != _DENSE and _gluon_runs_on(d) and sb.data_ptr() % 4 == 0
            and tma_ok)


def _use_gluon_v3(aq: torch.Tensor, bq: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None, recipe: Recipe) -> bool:
    """gemm_gluon_fp8_kernel covers the dense V3 recipe (fp32 scales per 1 x 128 and 128 x 128) without
    accumulate-into, where _gluon_runs_on allows it. Its operands and output go through TMA: 16-byte aligned bases
    and row strides (N % 8 == 0 for the bf16 output). It runs one 128 x 128 tile per SM at a time, so a GEMM of fewer
    tiles than SMs stays on gemm_kernel's 64 x 128 tiles (wkv, 4,096 x 512: 128 tiles, 268 against 440 TFLOP/s with
    host time included; docs/reports/deepgemm-gluon-v3.md)."""
    if not (recipe == V3_RECIPE and aq.dtype == torch.float8_e4m3fn and bq.dtype == torch.float8_e4m3fn and c is None
            and _gluon_runs_on(d)):
        return False
    tma_ok = all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in (aq, bq, d))
    tiles = cdiv(aq.shape[0], 128) * cdiv(bq.shape[0], 128)
    return tma_ok and tiles >= sm_count(d.device)


def _use_gluon_v41(aq: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                   c: torch.Tensor | None, recipe: Recipe) -> bool:
    """gemm_gluon_fp8_kernel's V4.1 kernel covers dense FP8 x FP8 GEMMs of the V4.1 recipe (UE8M0 per 1 x 32 and
    32 x 32, as uint8 here) without accumulate-into, where _gluon_runs_on allows it: K % 128 == 0 (four scales per
    32-bit word), TMA-compatible operands and output (unit last stride, 16-byte aligned bases and row strides) and
    4-byte aligned scale rows."""
    if not (recipe == V41_RECIPE and aq.dtype == torch.float8_e4m3fn and bq.dtype == torch.float8_e4m3fn
            and c is None and aq.shape[1] % 128 == 0 and _gluon_runs_on(d)):
        return False
    tma_ok = all(t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
                 for t in (aq, bq, d))
    words_ok = all(t.stride(1) == 1 and t.data_ptr() % 4 == 0 and t.stride(0) % 4 == 0 for t in (sa, sb))
    return tma_ok and words_ok


def _gluon_v41_tile(M: int, N: int, K: int, device: torch.device) -> tuple[int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, stages, programs per SM, scales in the ring) of the V4.1 kernel: 128 x 128 persistent
    tiles (one program per SM) when they give at least half an SM's worth of tiles, else 64 x 32 tiles, one program
    each, so that few rows or narrow N still spread over the SMs (session 12 run 2: M = 1-64, 64 x 32 read weights
    at 0.43-1.46 TB/s; the 128 x 128 tiles ran 468-569 TFLOP/s at M = 4,096). The 128 x 128 tiles take their scales
    through the ring as fp32 in calls of at least _V41_RING_MIN_FLOP (_gluon_fp8_v41_gemm)."""
    sms = sm_count(device)
    if M > 64 and cdiv(M, 128) * cdiv(N, 128) * 2 >= sms:
        return 128, 128, 4, 1, 2 * M * N * K >= _V41_RING_MIN_FLOP
    return 64, 32, 6, 0, False


# FLOPs from which the V4.1 kernel's 128 x 128 tiles take fp32 scales through the ring: whole calls (the ring's two
# conversion launches, ~3 us, included) against the UE8M0 words, both with one MMA per K block (session 18 run 1, 8
# dense shapes x M 512 / 1,024 / 4,096): 1.02-1.05x at the 9 calls from 8e10 FLOPs, 0.80-1.01x below (wkv and
# idx_wq_b lose most; docs/reports/deepgemm-gluon-v41.md).
_V41_RING_MIN_FLOP = 8e10


@functools.cache
def _unswizzled_f32_layout():
    """The shared layout of the V4.1 kernel's fp32 scale boxes: row-major (the kernel reads rows of them)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _f32_scales_transposed(s: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes [R, C] -> fp32 [C, R] (a view of [C, R rounded up to 4]: 16-byte row strides for TMA), the values
    the kernels convert to (byte 0: 2^-127)."""
    from .gemm_gluon_fp8_kernel import ue8m0_to_f32_transposed_kernel

    R, C = s.shape
    out = torch.empty(C, cdiv(R, 4) * 4, dtype=torch.float32, device=s.device)
    ue8m0_to_f32_transposed_kernel[(cdiv(R, 64), cdiv(C, 64))](s, out, R, C, s.stride(0), out.stride(0), BLOCK_R=64,
                                                               BLOCK_C=64, enable_fp_fusion=True)
    return out[:, :R]


@functools.cache
def _nvmma_layout(block: tuple[int, ...], dtype: torch.dtype):
    """The swizzled shared layout of a TMA tile (cached: building it costs ~9 us of host time, and a call's three
    descriptors are host time that small GEMMs wait for)."""
    from triton.experimental.gluon import language as gl

    gl_dtype = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.uint8: gl.uint8}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype)


def _tma_desc(t: torch.Tensor, block: tuple[int, ...]):
    """A TMA descriptor of t in `block` tiles with the swizzled shared layout the Gluon kernels allocate."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(t, list(block), _nvmma_layout(block, t.dtype))


# Registers per thread after setmaxnreg in the warp-specialized Gluon GEMMs (gemm_gluon_fp8_kernel's dense kernels,
# gemm_gluon_kernel.fp4_contiguous_ws_kernel): a second math warpgroup's partition holds its fp32 accumulators and
# a fresh MMA tile or the converted operands; the TMA producer warp only issues copies and waits on mbarriers. 12
# warps start with 168 (64K per SM): 232 x 8 warps + 40 x 4 (the producer's warpgroup) fit.
_GLUON_CONSUMER_REGS, _GLUON_PRODUCER_REGS = 232, 40


def _dense_gluon_launch(tiles: int, block_m: int, per_sm: int, device: torch.device) -> tuple[tuple[int], int]:
    """(grid, maxnreg) of gemm_gluon_fp8_kernel's dense kernels: per_sm persistent programs per SM (0: one program
    per tile). Registers per thread: the SM's 64K over the programs resident on it (persistent: per_sm; one per
    tile: shared memory holds one 128-row program, two 64-row ones) and their warps: one warpgroup per 64 rows plus
    the producer's (setmaxnreg works per warpgroup; the producer keeps _GLUON_PRODUCER_REGS, a second math
    warpgroup takes _GLUON_CONSUMER_REGS, and the first gets what is left). 128 rows: 12 warps, 168 (each math
    warpgroup 232, no spills); at most 168, the budget measured (session 11)."""
    grid = (min(tiles, per_sm * sm_count(device)) if per_sm else tiles,)
    warps = block_m // 16 + 4
    return grid, min(168, 65536 // ((per_sm or 128 // block_m) * warps * 32) // 8 * 8)


# Up to this K, a 256-column tile of the V3 kernel stores its second half from a buffer of its own instead of waiting
# for the first half's store to leave shared memory (the two buffers fit beside 3 ring stages, not 4). The wait is
# once per tile, so it weighs most where a tile has few K steps: at K = 1,280 and 2,304 the second buffer ran
# 1.00-1.04x (12 of 12 measurements, two H100 runs), at K >= 5,120 0.98-1.03x, mixed (session 63,
# docs/reports/deepgemm-gluon-v3.md). Same bits either way.
V3_STORE_BUFS_MAX_K = 2304


def _gluon_v3_store_bufs(block_n: int, K: int, cfg: dict) -> tuple[int, int]:
    """(store buffers per math warpgroup, ring stages) of a V3 launch: cfg["GLUON_STORE_BUFS"] if given, else two
    for 256-column tiles up to V3_STORE_BUFS_MAX_K; with two, at most 3 of cfg["GLUON_STAGES"] (shared memory)."""
    store_bufs = cfg.get("GLUON_STORE_BUFS", 2 if block_n == 256 and K <= V3_STORE_BUFS_MAX_K else 1)
    return store_bufs, min(cfg["GLUON_STAGES"], 3) if store_bufs == 2 else cfg["GLUON_STAGES"]


# 128-column tiles take their K steps in pairs when there is an even number of them: each pair's second MMA is
# issued before the first is waited for, so the first's promotion runs under it (session 64: 1.04-1.15x the one-step
# loop at all 16 dense shape and M pairs on an H100, bitwise equal). Against 256-column tiles (one step at a time,
# each half promoted while its warpgroup has no MMA running, but B's tile read once per 256 columns) the pairs ran
# 0.95-0.99x per tile where both tile widths fill the SMs' waves alike, and won where the 128-column tiles fill the
# last wave better: so they take a long-K GEMM (past V3_STORE_BUFS_MAX_K, where the wide tiles' second store buffer
# stops) when their waves are at least V3_PAIRS_WAVE_GAIN fuller (docs/reports/deepgemm-gluon-v3.md, session 64).
V3_PAIRS_WAVE_GAIN = 1.02


def _v3_pairs(block_n: int, K: int) -> bool:
    """Whether a V3 launch's tiles take their K steps in pairs: 128-column tiles and an even number of K steps."""
    return block_n == 128 and K // 128 % 2 == 0


def _wave_fill(tiles: int, programs: int) -> float:
    """The share of the last wave's programs that get a tile, over whole waves: tiles / (waves x programs)."""
    return tiles / (cdiv(tiles, programs) * programs)


def _gluon_v3_block_n(M: int, N: int, K: int, block_m: int, device: torch.device) -> int:
    """Columns of the V3 kernel's tiles: 256 where 128 x 256 tiles fill the SMs' waves to at least 85%, unless K >
    V3_STORE_BUFS_MAX_K with an even number of K steps and the 128 x 128 tiles (K steps in pairs) fill theirs
    V3_PAIRS_WAVE_GAIN times better; else 128. Session 14 run 3 (M = 4,096, bitwise equal): 256 columns ran 1.04-1.10x
    the 128-column tiles of then (one K step at a time) at the six dense shapes whose 256-wide tiles fill 87-99% of
    their last wave, and 0.68-0.90x at wq_a (160 tiles on 132 SMs: a second wave 21% full) and wkv (64 tiles);
    session 64 measured the pairs (V3_PAIRS_WAVE_GAIN's comment)."""
    if block_m != 128:
        return 128
    sms = sm_count(device)
    fill_256 = _wave_fill(cdiv(M, 128) * cdiv(N, 256), sms)
    if fill_256 < 0.85:
        return 128
    fill_128 = _wave_fill(cdiv(M, 128) * cdiv(N, 128), sms)
    pairs_win = K > V3_STORE_BUFS_MAX_K and _v3_pairs(128, K) and fill_128 >= V3_PAIRS_WAVE_GAIN * fill_256
    return 128 if pairs_win else 256


def _gluon_fp8_v3_gemm(aq: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                       cfg: dict) -> None:
    """gemm_gluon_fp8_kernel's dense GEMM: cfg["GLUON_BLOCK_M"] x block_n tiles (128 rows: two math warpgroups, 64:
    one, plus the TMA producer warp; block_n = cfg["GLUON_BLOCK_N"] if given, else _gluon_v3_block_n's choice), K
    in steps of 128 (one scale each), cfg["GLUON_PROGRAMS_PER_SM"] persistent programs per SM (0: one per tile),
    cfg.get("GLUON_STORE_BUFS") store buffers per math warpgroup (default: 2 for 256-column tiles up to
    V3_STORE_BUFS_MAX_K, with at most 3 ring stages; else 1), K steps in pairs with two MMAs in flight on 128 x 128
    tiles with an even number of K steps unless cfg.get("GLUON_PAIRS") is False; sa fp32 [M, K/128], sb fp32 [N/128,
    K/128], both with unit stride along K (_launch makes them contiguous)."""
    from .gemm_gluon_fp8_kernel import fp8_gemm_v3_kernel

    M, K = aq.shape
    N = bq.shape[0]
    block_m = cfg["GLUON_BLOCK_M"]
    block_n = cfg["GLUON_BLOCK_N"] if "GLUON_BLOCK_N" in cfg else _gluon_v3_block_n(M, N, K, block_m, d.device)
    store_bufs, stages = _gluon_v3_store_bufs(block_n, K, cfg)
    pairs = cfg.get("GLUON_PAIRS", True) and block_m == 128 and _v3_pairs(block_n, K)
    grid, maxnreg = _dense_gluon_launch(cdiv(M, block_m) * cdiv(N, block_n), block_m, cfg["GLUON_PROGRAMS_PER_SM"],
                                        d.device)
    fp8_gemm_v3_kernel[grid](
        _tma_desc(aq, (block_m, 128)), _tma_desc(bq, (block_n, 128)), _tma_desc(d, (64, 128)),
        sa, sb, M, N, K, sa.stride(0), sb.stride(0),
        STAGES=stages, GROUP_M=cfg["GROUP_M"], CONSUMER_REGS=_GLUON_CONSUMER_REGS,
        PRODUCER_REGS=_GLUON_PRODUCER_REGS, STORE_BUFS=store_bufs, PAIRS=pairs, num_warps=4, maxnreg=maxnreg,
        enable_fp_fusion=True)


def _gluon_fp8_v41_gemm(aq: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                        block_m: int, block_n: int, stages: int, per_sm: int, scales_in_ring: bool = False) -> None:
    """gemm_gluon_fp8_kernel's dense GEMM of the V4.1 recipe: FP8 MMAs promoted every 32 of K, block_m x block_n
    tiles (block_m 128: two math warpgroups, 64: one; block_n 128 or 32), `stages` ring steps of K = 128, per_sm
    persistent programs per SM (0: one per tile), K in the split-K kernel's slices of the weight's shape
    (_splitk_slices, so that a row has the same bits on either kernel). sa uint8 [M, K/32], sb uint8 [ceil(N/32),
    K/32]: read as 32-bit words (K % 128 == 0, 4-byte aligned bases and row strides: checked by _use_gluon_v41),
    or with scales_in_ring (block_n 128) first converted to fp32, A's M-major, and brought by the kernel's producer
    with the operands (the same values: bitwise the same output)."""
    from .gemm_gluon_fp8_kernel import fp8_gemm_v41_kernel
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    M, K = aq.shape
    N = bq.shape[0]
    sa_desc = sb_desc = None
    if scales_in_ring:
        sa_desc = TensorDescriptor.from_tensor(_f32_scales_transposed(sa), [4, block_m], _unswizzled_f32_layout())
        sb_desc = TensorDescriptor.from_tensor(_f32_scales_transposed(sb), [4, 8], _unswizzled_f32_layout())
    grid, maxnreg = _dense_gluon_launch(cdiv(M, block_m) * cdiv(N, block_n), block_m, per_sm, d.device)
    fp8_gemm_v41_kernel[grid](
        _tma_desc(aq, (block_m, 128)), _tma_desc(bq, (block_n, 128)), _tma_desc(d, (64, block_n)),
        sa.view(torch.int32), sb.view(torch.int32), sa_desc, sb_desc, M, N, K, sa.stride(0) // 4, sb.stride(0) // 4,
        _splitk_slices(N, K)[0], STAGES=stages, GROUP_M=8, CONSUMER_REGS=_GLUON_CONSUMER_REGS,
        PRODUCER_REGS=_GLUON_PRODUCER_REGS, SCALES_IN_RING=scales_in_ring, num_warps=4, maxnreg=maxnreg,
        enable_fp_fusion=True)


def _splitk_runs(M: int, N: int, K: int) -> bool:
    """Whether a V4.1-recipe call takes the split-K kernel (gemm_gluon_fp8_splitk_kernel: one token tile of 16, 32
    or 64, N % 128 == 0) rather than the 64 x 32 tiles; both give a row the same bits, so the choice is speed
    alone. Session 42 runs 2-3 (H200, CUDA-graph replay, weights from HBM; docs/reports/deepgemm-v41-splitk.md), at
    the six decode shapes: at 1 and 16 rows split-K ran 1.06-2.85x the tiles; at 32 rows 1.24-2.07x where K >=
    2,304 and 0.95x at idx_wq_b (K = 1,280: 128 tile programs of 10 steps fill the SMs already); at 64 rows
    1.28-1.70x where the tiles give fewer programs than SMs (wq_a, wkv: N / 32 = 40, 16) or K = 8,192 (wo_b: a
    tile program's serial chain of 64 steps), 0.73-0.95x at the other three (each weight block's 64-token
    promotions, one FMA and one scale product per element and 32 of K, cost more than the split saves)."""
    if N % 128 or M > 64:
        return False
    return M <= 16 or (M <= 32 and K >= 2048) or N <= 2048 or K >= 8192


# The split-K kernel's grid aims at this many programs (two per SM on an H200's 132) with slices of at least
# _SPLITK_MIN_STEPS K steps of 128. Constants, not the device's SM count: the slices decide a row's bits (in the
# tile kernels too), so they depend on the weight's shape alone.
_SPLITK_PROGRAMS, _SPLITK_MIN_STEPS = 256, 4


def _splitk_slices(N: int, K: int) -> tuple[int, int]:
    """(K steps per slice, slices) of the split-K kernel for a weight [N, K]: enough slices for the grid to reach
    _SPLITK_PROGRAMS programs of 128 weight rows, none shorter than _SPLITK_MIN_STEPS steps (a program's
    fixed costs and the partial sums' traffic, 4 x splits x M x N bytes, grow with the slice count)."""
    steps = K // 128
    splits = max(1, min(steps // _SPLITK_MIN_STEPS, cdiv(_SPLITK_PROGRAMS, cdiv(N, 128))))
    per_slice = cdiv(steps, splits)
    return per_slice, cdiv(steps, per_slice)


def _gluon_fp8_v41_splitk_gemm(aq: torch.Tensor, sa: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor,
                               d: torch.Tensor, slice_steps: int, splits: int, stages: int = 3) -> None:
    """gemm_gluon_fp8_splitk_kernel's dense GEMM of the V4.1 recipe at M <= 64 rows: weights as the MMA's A
    operand, K in `splits` slices of `slice_steps` steps of 128 (the last may be shorter), the slices' fp32 partial
    sums added in order by splitk_sum_kernel; a ring of `stages` steps (3: session 42 run 2's sweep at 64 rows, 3
    at least as fast as 4 and 6 at every shape). Operands as _gluon_fp8_v41_gemm's (checked by _use_gluon_v41), N %
    128 == 0."""
    from .gemm_gluon_fp8_splitk_kernel import fp8_gemm_v41_splitk_kernel, splitk_sum_kernel

    M, K = aq.shape
    N = bq.shape[0]
    block_t = _token_tile(M)
    part = torch.empty(splits, M, N, dtype=torch.float32, device=d.device) if splits > 1 else d
    fp8_gemm_v41_splitk_kernel[(N // 128, splits)](
        _tma_desc(bq, (128, 128)), _tma_desc(aq, (block_t, 128)), part, sa.view(torch.int32), sb.view(torch.int32),
        M, N, K, slice_steps, sa.stride(0) // 4, sb.stride(0) // 4, part.stride(-2), STAGES=stages,
        SPLIT=splits > 1, num_warps=4, enable_fp_fusion=True)
    if splits > 1:
        splitk_sum_kernel[(cdiv(M * N, 1024),)](
            part, d, M, N, splits, d.stride(0), BLOCK=1024, num_warps=4, enable_fp_fusion=True)


def _dequant_masked_rows(aq: torch.Tensor, sa: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """bf16 [G, max_m, K] in the FP4 K order from the masked layout's e4m3 [G, max_m, K] and UE8M0 bytes: the rows
    each group uses (masked_m, read on the device: no host sync) are written, the others left unwritten. The buffer
    has the whole capacity, as the GEMM addresses a row by its position (deepgemm-gluon.md: 252 MB at the engine's
    64-token decode)."""
    G, max_m, K = aq.shape
    x = _dequant_activations(aq.reshape(G * max_m, K), sa.reshape(G * max_m, -1), True, masked_m=(masked_m, max_m))
    return x.view(G, max_m, K)


def _gluon_fp4_grouped_gemm(layout: int, x: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                            group_arg: torch.Tensor, cfg: dict) -> None:
    """gemm_gluon_kernel's grouped FP8 x FP4 GEMM (contiguous or masked) on x from _dequant_activations (FP4 K
    order): the same products in the same order as the swap-AB kernel (bitwise equal results), the weights
    converted in the MMA's register layout (docs/reports/deepgemm-gluon.md). It reads the scales as 32-bit words:
    4-byte aligned rows (K % 128 == 0, checked by _launch) and base (checked by _use_gluon)."""
    from .gemm_gluon_kernel import fp4_grouped_gemm_kernel

    masked = layout == _MASKED
    M, K = x.shape[-2:]
    N = bq.shape[-2]
    if not masked and cfg.get("GLUON_WS"):
        _gluon_fp4_contiguous_ws_gemm(x, bq, sb, d, group_arg, cfg["GLUON_STAGES"], bool(cfg.get("GLUON_FOLD")))
        return
    grid = (cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]), x.shape[0] if masked else 1)
    fp4_grouped_gemm_kernel[grid](
        x, bq, sb, d, group_arg, M, N, K, x.stride(0) if masked else 0, x.stride(-2), bq.stride(0), bq.stride(1),
        sb.stride(0), sb.stride(1), d.stride(0) if masked else 0, d.stride(-2),
        MASKED=masked, BLOCK_N=cfg["BLOCK_N"], BLOCK_M=cfg["BLOCK_M"], STAGES=cfg["GLUON_STAGES"],
        GROUP_M=cfg["GROUP_M"], FOLD_SCALE=bool(cfg.get("GLUON_FOLD")), num_warps=4, enable_fp_fusion=True)


def _gluon_fp4_contiguous_ws_gemm(x: torch.Tensor, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                                  layout: torch.Tensor, stages: int, fold: bool = False) -> None:
    """gemm_gluon_kernel.fp4_contiguous_ws_kernel (the contiguous layout warp-specialized: 256 weight rows x 128
    tokens, the layout's alignment, per persistent tile; bitwise equal to fp4_grouped_gemm_kernel) on x from
    _dequant_activations. Its TMA copies need 16-byte aligned x and bq (checked by _use_gluon; x is allocated by the
    pass)."""
    from .gemm_gluon_kernel import fp4_contiguous_ws_kernel

    G, N, K2 = bq.shape
    M, K = x.shape
    tiles = cdiv(M, _M_ALIGNMENT) * cdiv(N, 256)
    fp4_contiguous_ws_kernel[(min(tiles, sm_count(x.device)),)](
        _tma_desc(x, (_M_ALIGNMENT, 32)), _tma_desc(bq.view(G * N, K2), (256, 32)), sb, d, layout, M, N, K,
        sb.stride(0), sb.stride(1), d.stride(0), STAGES=stages, GROUP_M=8,
        CONSUMER_REGS=_GLUON_CONSUMER_REGS, PRODUCER_REGS=_GLUON_PRODUCER_REGS, FOLD_SCALE=fold, num_warps=4,
        maxnreg=65536 // (12 * 32) // 8 * 8, enable_fp_fusion=True)


def _swapab_gemm(x: torch.Tensor, sx: torch.Tensor | None, bq: torch.Tensor, sb: torch.Tensor, d: torch.Tensor,
                 layout: int, group_arg: torch.Tensor | None, b_fp4: bool, cfg: dict) -> None:
    """The gemm_swapab_kernel launch. x: bf16 from _dequant_activations (sx None), or e4m3 with its UE8M0 bytes sx
    (masked: [G, M, K]); bq uint8 (FP4) or e4m3, sb uint8. FP4 weights on CUDA take the inline-PTX conversion
    unless cfg["FP4_ASM"] is False (the interpreter cannot run PTX)."""
    from .gemm_swapab_kernel import swapab_gemm_kernel

    M, K = x.shape[-2:]
    N = bq.shape[-2]
    masked, grouped = layout == _MASKED, layout != _DENSE
    sx_arg = x if sx is None else sx  # unused by the kernel without X_FP8
    # scale words are 4-byte loads: K % 128 == 0 (checked by _launch) aligns the row and group strides of the
    # contiguous scale tensors; a view at an odd offset into a larger buffer would not be, so it takes byte loads
    words = cfg.get("SCALE_WORDS", True) and sb.data_ptr() % 4 == 0 and (sx is None or sx.data_ptr() % 4 == 0)
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    swapab_gemm_kernel[(tiles, x.shape[0]) if masked else (tiles,)](
        x, sx_arg, bq, sb, d, group_arg if grouped else d, M, N, K,
        x.stride(0) if masked else 0, x.stride(-2), sx_arg.stride(0) if masked else 0, sx_arg.stride(-2),
        bq.stride(0) if grouped else 0, bq.stride(-2), sb.stride(0) if grouped else 0, sb.stride(-2),
        d.stride(0) if masked else 0, d.stride(-2),
        W_IS_FP4=b_fp4, FP4_ASM=b_fp4 and x.is_cuda and cfg.get("FP4_ASM", True), X_FP8=sx is not None,
        SW_GRAN_N=1 if b_fp4 else 32, LAYOUT=layout, SCALE_WORDS=words, SUBS=cfg["SUBS"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_M=cfg["BLOCK_M"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=True)


def _dequant_activations(aq: torch.Tensor, sa: torch.Tensor, fp4_order: bool, block_m: int = 8, block_k: int = 512,
                         num_warps: int = 4, grouped_layout: torch.Tensor | None = None,
                         masked_m: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """bf16 [M, K] = aq * 2^(sa - 127) (sa: UE8M0 bytes as uint8), in the FP4 kernel's K order if fp4_order.
    8 x 512 tiles (deepgemm-swapab.md; the FP4 order's contiguous pair loads: deepgemm-activation-pass.md).
    Rows left unwritten (any bits, NaN included): with grouped_layout (int32 [M], the contiguous layout) those marked
    -1; with masked_m = (counts, rows_per_group) (int32 [M / rows_per_group] on the device: the masked layout's
    masked_m) the rows of each group past its count. The swap-AB and Gluon GEMMs are safe with that: output row m
    depends on row m of x alone (one MMA column) and they store no such row. All M rows are still allocated, because
    the GEMMs address a row by its position."""
    from .gemm_swapab_kernel import ALL_ROWS, LAYOUT_ROWS, MASKED_ROWS, dequant_act_kernel

    M, K = aq.shape
    if fp4_order and (aq.stride(0) % 2 or aq.data_ptr() % 2):
        # the FP4 order reads q as 2-byte pairs; a fresh copy is aligned (contiguous() would keep an odd offset)
        aq = aq.clone(memory_format=torch.contiguous_format)
    x = torch.empty(M, K, dtype=torch.bfloat16, device=aq.device)
    rows, rows_per_group, row_filter = aq, 1, ALL_ROWS.value
    if grouped_layout is not None:
        rows, row_filter = grouped_layout, LAYOUT_ROWS.value
    if masked_m is not None:
        (rows, rows_per_group), row_filter = masked_m, MASKED_ROWS.value
    dequant_act_kernel[(cdiv(M, block_m), cdiv(K, block_k))](
        aq, sa, x, rows, M, K, rows_per_group, aq.stride(0), sa.stride(0), x.stride(0), PERMUTE_FP4=fp4_order,
        ROW_FILTER=row_filter, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps, enable_fp_fusion=True)
    return x


def _launch(layout: int, a: FP8Operand, b: FP8Operand, d: torch.Tensor, c: torch.Tensor | None,
            group_arg: torch.Tensor | None, recipe: Recipe, b_fp4: bool, expected_m: int | None,
            config: dict | None, fold_scales: bool = False) -> None:
    """fold_scales: every FP4 scale byte is <= 128, so the Gluon FP4 kernels may fold (cfg GLUON_FOLD)."""
    from .gemm_kernel import scaled_gemm_nt_kernel

    (aq, sa), (bq, sb) = a, b
    _, gran_n, gran_k = recipe
    sa, sb = sa.contiguous(), sb.contiguous()  # the kernel steps scales by 1 along K
    ue8m0 = sa.dtype in _UE8M0_DTYPES
    if ue8m0:
        sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    if b_fp4:
        bq = bq.view(torch.uint8)
    rows = aq.shape[-2]
    N, K = bq.shape[-2], aq.shape[-1]
    rows_hint = expected_m if layout == _MASKED else rows
    groups = bq.shape[0] if layout == _CONTIGUOUS else 1
    cfg = config or default_config(layout, rows_hint, gran_k, ue8m0, N, groups, b_fp4)
    if fold_scales:
        cfg = {**cfg, "GLUON_FOLD": True}
    _require(ue8m0 or not cfg["BF16_MMA"], "the bf16 MMA path needs UE8M0 scales")
    # one check for both kernels: the swap-AB fallback below takes gemm_kernel_config's tiles, which divide it
    _require(layout != _CONTIGUOUS or _M_ALIGNMENT % cfg["BLOCK_M"] == 0, "BLOCK_M must divide the M alignment")
    if cfg.get("GLUON_V41") and _use_gluon_v41(aq, sa, bq, sb, d, c, recipe):
        if _splitk_runs(rows, N, K):
            _gluon_fp8_v41_splitk_gemm(aq, sa, bq, sb, d, *_splitk_slices(N, K))
        else:
            _gluon_fp8_v41_gemm(aq, sa, bq, sb, d, *_gluon_v41_tile(rows, N, aq.shape[1], d.device))
        return
    if cfg.get("SWAP_AB"):
        _require(ue8m0, "the swap-AB kernel takes UE8M0 scales")
        if c is None and gran_k == 32 and K % (128 * cfg["SUBS"]) == 0 and (b_fp4 or gran_n == 32):
            _launch_swapab(layout, (aq, sa), (bq, sb), d, group_arg, b_fp4, cfg)
            return
        # accumulate-into, K not a multiple of the step, or another recipe than V4.1's: gemm_kernel's bf16 MMAs
        cfg = gemm_kernel_config(layout, rows_hint, gran_k, ue8m0)
    if cfg.get("GLUON") and layout == _DENSE and _use_gluon_v3(aq, bq, d, c, recipe):
        _gluon_fp8_v3_gemm(aq, sa, bq, sb, d, cfg)
        return
    cfg = {k: v for k, v in cfg.items() if not k.startswith("GLUON")}  # gemm_kernel's parameters only
    if cfg["BF16_MMA"]:  # longest step (up to BLOCK_K) that divides K
        cfg = {**cfg, "BLOCK_K": next(bk for bk in (cfg["BLOCK_K"], 64, 32) if K % bk == 0 and bk % gran_k == 0)}
    else:
        cfg = {**cfg, "BLOCK_K": gran_k}
    tiles = cdiv(rows, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    grid = (tiles, aq.shape[0]) if layout == _MASKED else (tiles,)
    grouped = layout != _DENSE
    scaled_gemm_nt_kernel[grid](
        aq, sa, bq, sb, d, c if c is not None else d, group_arg if group_arg is not None else d,
        rows, N, K,
        aq.stride(0) if layout == _MASKED else 0, aq.stride(-2),
        sa.stride(0) if layout == _MASKED else 0, sa.stride(-2),
        bq.stride(0) if grouped else 0, bq.stride(-2),
        sb.stride(0) if grouped else 0, sb.stride(-2),
        d.stride(0) if layout == _MASKED else 0, d.stride(-2),
        GRAN_K=gran_k, SB_GRAN_N=gran_n, B_IS_FP4=b_fp4, UE8M0_SCALES=ue8m0,
        LAYOUT=layout, HAS_C=c is not None, **cfg,
        enable_fp_fusion=True,
    )
