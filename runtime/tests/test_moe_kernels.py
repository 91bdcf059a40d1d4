"""The fused MoE glue kernels (layers/moe_kernels.py) against the torch chains of moe.py (their references).

Runs on CUDA (marked gpu), and on CPU under the Triton interpreter when TRITON_INTERPRET=1 is set (small shapes;
CPU CI runs this file that way through the last test). Inputs are random, never zeros, except where a case asks
for zeros (rows whose amax is 0); padding rows of the inputs hold NaN, so a kernel that read one into a real row
would fail. Only real rows are compared: the kernels leave padding rows unspecified.

Metrics:
- quant_scatter, combine: bit-identical on CUDA (the same quantizer code; fp32 adds in the torch loop's order).
  Under the interpreter quant_scatter is still bit-identical (the reference's per_token_group_quant_fp8 runs the
  same Triton code there), and combine within one bf16 ulp (the interpreter's fp32 -> bf16 cast truncates).
- swiglu_weight_quant: on CUDA the same fp32 operations as torch (libdevice expf, IEEE division), so the FP8 bytes
  and scales must be equal (bit-identical on H200, 2026-11-30; an exp that differed from torch's by an ulp could
  flip a bf16 rounding at a tie, and would show here first). The exact-match fractions are printed.
  Under the interpreter (tl.exp instead of libdevice, fp32 -> bf16 truncated, an e4m3 cast that mis-rounds some
  values) only loose bounds hold: scales equal on >= 99%, dequantized rel. L2 <= 5e-2 (measured ~2e-2).
- The same with fold_128 (scales folded per 128 columns: float32 [rows, width / 128]) where the width allows it,
  and for dense unweighted calls (every row real, no routing weight: the shared expert).
- moe_grouped with the kernels vs with the torch chains (CUDA, tiny checkpoint): rel. L2 <= 1e-3, exact-match
  fraction printed (bit-identical whenever the SwiGLU bytes are, as the GEMMs are row-local and deterministic).
"""

from __future__ import annotations

import pytest
import torch
from mini_deepgemm.reference import act_dequant

from mini_deepinfer.layers import moe_kernels as mk
from mini_deepinfer.models.deepseek_v41 import load_checkpoint, moe, ops, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.model import engine_weights

from kernel_devices import DEVICE, INTERPRET, interpreter_child, kernel_test, run_under_interpreter

LIMIT = 10.0  # V41Config.swiglu_limit
pytestmark = pytest.mark.skipif(mk.triton is None, reason="needs triton")

# contiguous cases: rows per expert (0 = an empty expert), alignment of each segment, extra padding rows at the end,
# intermediate size I. Ragged: padding inside segments, experts with 0 and 1 rows, M not a multiple of the tile.
CONTIGUOUS = [([3, 0, 1, 17], 8, 5, 96), ([1, 0, 0, 2, 9], 16, 3, 256)]
MASKED = [([0, 1, 5, 3, 7], 7, 96), ([2, 0, 1], 4, 256)]  # masked_m per expert, rows per expert, I
if DEVICE == "cuda":  # real V4.1-Flash widths (I = 2,304: 72 groups), 128-row segments
    CONTIGUOUS += [([130, 0, 1, 127, 128, 40], 128, 200, 2304), ([5, 300, 0, 64], 128, 0, 2304)]
    MASKED += [([0, 1, 64, 17, 3, 0, 2], 64, 2304), ([6] * 20, 8, 2304)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _contiguous_layout(counts: list[int], align: int, tail: int) -> torch.Tensor:
    parts = []
    for e, n in enumerate(counts):
        if n:
            padded = -(-n // align) * align
            parts.append(torch.tensor([e] * n + [-1] * (padded - n), dtype=torch.int32))
    parts.append(torch.full((tail,), -1, dtype=torch.int32))
    return torch.cat(parts)


def _swiglu_inputs(real: torch.Tensor, inter: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """h13 bf16 [M, 2I] with |values| up to ~30 (many past the clamp limit 10), weights in (0.05, 1]; padding rows
    NaN; one real row with weight 0 (h = 0: amax 0, clamped to 1e-4) and one with a zero up-half in its first
    group (one group of amax 0)."""
    g = _gen(seed)
    M = real.shape[0]
    h13 = torch.randn(M, 2 * inter, generator=g) * torch.rand(M, 1, generator=g) * 12
    w = torch.rand(M, generator=g) * 0.95 + 0.05
    rows = real.nonzero().squeeze(1)
    if rows.numel() >= 2:
        w[rows[0]] = 0.0
        h13[rows[-1], inter: inter + mk.QUANT_GROUP] = 0.0
    h13[~real] = float("nan")
    w[~real] = float("nan")
    return h13.to(torch.bfloat16).to(DEVICE), w.to(DEVICE)


def _compare_quant(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
                   real: torch.Tensor) -> None:
    real = real.to(got[0].device)
    q, s = (t.view(torch.uint8)[real].cpu() for t in got)
    qr, sr = (t.view(torch.uint8)[real].cpu() for t in want)
    assert q.shape == qr.shape and s.shape == sr.shape
    q_eq, s_eq = (q == qr).float().mean().item(), (s == sr).float().mean().item()
    scale_dtype, block = (torch.float32, 128) if got[1].dtype == torch.float32 else (torch.float8_e8m0fnu, 32)
    a = act_dequant(q.view(torch.float8_e4m3fn), s.view(scale_dtype), block)
    b = act_dequant(qr.view(torch.float8_e4m3fn), sr.view(scale_dtype), block)
    rel = ((a - b).norm() / b.norm()).item()
    print(f"swiglu_weight_quant vs torch chain: bytes equal {100 * q_eq:.4f}%, scales equal {100 * s_eq:.4f}%, "
          f"dequantized rel L2 {rel:.2e}")
    assert torch.isfinite(a).all()
    if INTERPRET:
        assert s_eq >= 0.99 and rel <= 5e-2
    else:  # bit-identical (H200, 2026-11-30: every case 100%)
        assert s_eq == 1.0 and q_eq == 1.0


@kernel_test
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the reference quantizes the NaN padding rows
@pytest.mark.parametrize("tile", [(mk.SWIGLU_BLOCK_M, mk.SWIGLU_GROUPS_PER_PROGRAM), (1, 2), (1, 4)],
                         ids=["default", "1x2", "1x4"])
@pytest.mark.parametrize("counts,align,tail,inter", CONTIGUOUS)
@pytest.mark.parametrize("fold_128", [False, True], ids=["per32", "fold128"])
def test_swiglu_weight_quant_contiguous_matches_the_torch_chain(counts, align, tail, inter, tile, fold_128) -> None:
    if fold_128 and (inter % 128 or tile[1] % 4):
        pytest.skip("fold_128 needs I % 128 == 0 and groups in fours")
    layout = _contiguous_layout(counts, align, tail)
    real = layout >= 0
    h13, w = _swiglu_inputs(real, inter, seed=len(layout) + inter)
    got = mk.swiglu_weight_quant(h13, w, LIMIT, grouped_layout=layout.to(DEVICE), block_m=tile[0],
                                 groups_per_program=tile[1], fold_128=fold_128)
    assert got[0].dtype == torch.float8_e4m3fn
    assert got[1].dtype == (torch.float32 if fold_128 else torch.float8_e8m0fnu)
    assert got[0].shape == (len(layout), inter) and got[1].shape == (len(layout), inter // (128 if fold_128 else 32))
    _compare_quant(got, moe.swiglu_weight_quant_torch(h13, w, LIMIT, fold_128), real)


@kernel_test
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the reference quantizes the NaN padding rows
@pytest.mark.parametrize("counts,rows,inter", MASKED)
@pytest.mark.parametrize("fold_128", [False, True], ids=["per32", "fold128"])
def test_swiglu_weight_quant_masked_matches_the_torch_chain(counts, rows, inter, fold_128) -> None:
    if fold_128 and inter % 128:
        pytest.skip("fold_128 needs I % 128 == 0")
    masked_m = torch.tensor(counts, dtype=torch.int32)
    real = (torch.arange(rows)[None, :] < masked_m[:, None]).flatten()
    h13, w = _swiglu_inputs(real, inter, seed=rows + inter)
    listed = real.nonzero().flatten()[torch.randperm(int(real.sum()), generator=_gen(rows))]  # any order
    _compare_quant(mk.swiglu_weight_quant(h13, w, LIMIT, rows=listed.to(DEVICE), fold_128=fold_128),
                   moe.swiglu_weight_quant_torch(h13, w, LIMIT, fold_128), real)


@kernel_test
@pytest.mark.parametrize("M,inter", [(8, 96), (37, 256)] + ([(300, 2304)] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("fold_128", [False, True], ids=["per32", "fold128"])
def test_swiglu_weight_quant_dense_unweighted_matches_the_torch_chain(M, inter, fold_128) -> None:
    """No row list, no layout, no weights (the shared expert): every row real, h not scaled (the torch chain with
    weight 1, which multiplies exactly)."""
    if fold_128 and inter % 128:
        pytest.skip("fold_128 needs I % 128 == 0")
    h13, _ = _swiglu_inputs(torch.ones(M, dtype=torch.bool), inter, seed=M + inter)
    _compare_quant(mk.swiglu_weight_quant(h13, None, LIMIT, fold_128=fold_128),
                   moe.swiglu_weight_quant_torch(h13, torch.ones(M, device=DEVICE), LIMIT, fold_128),
                   torch.ones(M, dtype=torch.bool))


def test_swiglu_weight_quant_takes_at_most_one_validity_form_and_foldable_widths() -> None:
    h13 = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        mk.swiglu_weight_quant(h13, torch.ones(4), LIMIT, torch.zeros(4, dtype=torch.int32),
                               torch.arange(4))
    with pytest.raises(ValueError, match="multiple of 128"):
        mk.swiglu_weight_quant(h13, torch.ones(4), LIMIT, rows=torch.arange(4), fold_128=True)
    with pytest.raises(ValueError, match="groups_per_program"):
        mk.swiglu_weight_quant(torch.zeros(4, 256, dtype=torch.bfloat16), torch.ones(4), LIMIT, rows=torch.arange(4),
                               groups_per_program=2, fold_128=True)


def _routing(T: int, k: int, E: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    logits = torch.randn(T, E, generator=g)
    logits[:, : E // 4] += 3.0  # hot experts; others empty
    return logits.topk(k, dim=1).indices, torch.rand(T, k, generator=g)


def _plans() -> list:
    big = DEVICE == "cuda"
    cases = [(1, 6, 32), (7, 6, 32), (65, 2, 8), (130, 6, 384 if big else 32)] + ([(4096, 6, 384)] if big else [])
    return [pytest.param(T, k, E, masked, id=f"T{T}-k{k}-E{E}-{'masked' if masked else 'contiguous'}")
            for T, k, E in cases for masked in (False, True) if not (masked and T > moe.MASKED_MAX_TOKENS)]


@kernel_test
@pytest.mark.parametrize("T,k,E,masked", _plans())
@pytest.mark.parametrize("fold_128", [False, True], ids=["per32", "fold128"])
def test_quant_scatter_writes_every_pair_row_as_quant_gather(T, k, E, masked, fold_128) -> None:
    D = 5120 if DEVICE == "cuda" else 128 if fold_128 else 96
    idx, wt = _routing(T, k, E, seed=T * k + E)
    plan = (moe.masked_plan if masked else moe.contiguous_plan)(idx.to(DEVICE), wt.to(DEVICE), E)
    x = torch.randn(T, D, generator=_gen(T)) * torch.logspace(-3, 3, T)[:, None]
    x[T // 2] = 0.0  # a row of amax 0
    x = x.to(torch.bfloat16).to(DEVICE)
    M = plan.row_weight.shape[0]
    q, s = mk.quant_scatter(x, plan.pair_row, M, fold_128)
    qr, sr = moe.quant_gather_torch(x, plan.row_token, fold_128)
    assert q.shape == qr.shape and s.shape == sr.shape and s.dtype == sr.dtype
    rows = plan.pair_row.flatten()
    assert torch.equal(q.view(torch.uint8)[rows], qr.view(torch.uint8)[rows])
    assert torch.equal(s.view(torch.uint8)[rows], sr.view(torch.uint8)[rows])


@kernel_test
@pytest.mark.parametrize("T,k,E,masked", _plans())
def test_combine_is_bit_identical_to_the_torch_loop(T, k, E, masked) -> None:
    D = 5120 if DEVICE == "cuda" else 160  # 160: not a multiple of the column block
    idx, wt = _routing(T, k, E, seed=T + k + E)
    plan = (moe.masked_plan if masked else moe.contiguous_plan)(idx.to(DEVICE), wt.to(DEVICE), E)
    M = plan.row_weight.shape[0]
    g = _gen(M)
    out = torch.randn(M, D, generator=g) * torch.logspace(-2, 2, M)[:, None]
    pad = torch.ones(M, dtype=torch.bool)
    pad[plan.pair_row.flatten().cpu()] = False
    out[pad] = float("nan")  # never read
    out = out.to(torch.bfloat16).to(DEVICE)
    shared = (torch.randn(T, D, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    got = mk.combine(out, plan.pair_row, shared)
    want = moe.combine_torch(out, plan.pair_row, shared)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    if INTERPRET:
        ulp = want.float().abs() * 2**-7 + 1e-30
        assert bool(((got.float() - want.float()).abs() <= ulp).all())
    else:
        assert torch.equal(got, want)


@kernel_test
@pytest.mark.parametrize("T,k,E", [(0, 6, 32), (1, 6, 32), (7, 6, 32), (65, 2, 8), (130, 6, 384)]
                         + ([(4096, 6, 384), (5000, 6, 96)] if DEVICE == "cuda" else []))
def test_contiguous_plan_kernels_equal_the_torch_plan(T, k, E) -> None:
    """moe_kernels.contiguous_plan against moe._plan's torch chain (plan_expert_segments): every output equal, hot
    experts, empty experts, blocks that end inside a token's slots, 128-row alignment."""
    idx, wt = _routing(T, k, E, seed=T + E)
    idx, wt = idx.to(DEVICE), wt.to(DEVICE)
    align = moe.get_m_alignment_for_contiguous_layout()
    M = moe.max_rows(T * k, E, align)
    want = moe._plan(idx.cpu(), wt.cpu(), E, masked=False)  # CPU: the torch chain
    got = mk.contiguous_plan(idx, wt, E, align, M)
    for name, g, w in zip(("grouped_layout", "row_token", "row_weight", "pair_row"), got,
                          (want.grouped_layout, want.row_token, want.row_weight, want.pair_row)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w), name


@kernel_test
@pytest.mark.parametrize("T,k,E", [(0, 6, 32), (1, 6, 32), (7, 6, 32), (43, 6, 256), (65, 2, 8)]
                         + ([(64, 6, 384)] if DEVICE == "cuda" else []))
def test_masked_plan_kernels_equal_the_torch_plan(T, k, E) -> None:
    """moe_kernels.masked_plan against moe._plan's masked torch chain: every output equal (T rows per expert, hot
    and empty experts, a block of pairs that ends inside a token's slots); 64 tokens of 384 experts: decode."""
    idx, wt = _routing(T, k, E, seed=3 * T + E)
    want = moe._plan(idx, wt, E, masked=True)  # CPU: the torch chain
    got = mk.masked_plan(idx.to(DEVICE), wt.to(DEVICE), E)
    for name, g, w in zip(("row_token", "row_weight", "pair_row", "masked_m"), got,
                          (want.row_token, want.row_weight, want.pair_row, want.masked_m)):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w), name


@kernel_test
@pytest.mark.parametrize("T", [0, 3])
def test_empty_and_tiny_calls(T) -> None:
    """T = 0 launches nothing; outputs keep their shapes."""
    D, k = 64, 2
    x = torch.randn(T, D, generator=_gen(1)).to(torch.bfloat16).to(DEVICE)
    pair_row = torch.arange(T * k, dtype=torch.int64).view(T, k).to(DEVICE)
    q, s = mk.quant_scatter(x, pair_row, T * k)
    assert q.shape == (T * k, D) and s.shape == (T * k, D // 32)
    y = mk.combine(torch.randn(T * k, D).to(torch.bfloat16).to(DEVICE), pair_row, x)
    assert y.shape == (T, D)
    q, s = mk.swiglu_weight_quant(torch.empty(0, 2 * D, dtype=torch.bfloat16, device=DEVICE),
                                  torch.empty(0, device=DEVICE), LIMIT,
                                  grouped_layout=torch.empty(0, dtype=torch.int32, device=DEVICE))
    assert q.shape == (0, D) and s.shape == (0, D // 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 37, 64, 65, 300, 2048])
def test_moe_grouped_with_kernels_matches_the_torch_chains(T, monkeypatch) -> None:
    """End to end on the tiny checkpoint: the padding rows the kernels leave unwritten do not reach the output."""
    cfg, w = load_checkpoint(resolve_checkpoint("tiny"))
    ws = ops.KernelWeights(engine_weights(w, "cuda"))
    x = (torch.randn(T, cfg.hidden_size, generator=_gen(T)) * 0.5).to(torch.bfloat16).cuda()
    p = "layers.4.ffn"
    got = moe.moe_grouped(x, ws, p, cfg)
    monkeypatch.setattr(mk, "available", lambda t: False)
    want = moe.moe_grouped(x, ws, p, cfg)
    equal = (got == want).float().mean().item()
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    print(f"moe_grouped kernels vs torch chains, T={T}: {100 * equal:.4f}% equal, rel L2 {rel:.2e}")
    assert torch.isfinite(got).all() and rel <= 1e-3


@interpreter_child
def test_kernels_run_under_the_triton_interpreter_on_cpu() -> None:
    """CI has no GPU: run this file's kernel tests once under TRITON_INTERPRET=1."""
    run_under_interpreter(__file__)
