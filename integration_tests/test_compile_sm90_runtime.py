"""The runtime's Triton kernels (runtime/src/mini_deepinfer/layers/) and mini-deepep's layout kernels, compiled for an
H200 (sm_90) on a machine without a GPU, at the real DeepSeek-V4.1-Flash shapes.

Why: CPU CI runs these kernels only under Triton's interpreter (TRITON_INTERPRET=1), and there every constexpr branch
that only CUDA tensors take is skipped: libdevice's expf / log1pf / cosf (LIBDEVICE=x.is_cuda), the add.rn inline PTX
of linear_fp32 (INTERPRETED=not x.is_cuda), moe_route's enable_reflect_ftz=False option. So a kernel that would not
compile for sm_90, or whose registers or shared memory would not let it launch, or that spills, was first seen on
the GPU machine. Here each public entry point is called with `cuda_like` CPU tensors inside `compiling_for_sm90()`
(integration_tests/sm90_compile.py): it takes the route it takes on an H200 and every launch compiles instead of
running. Each case checks
1. the exact kernels compiled, in launch order (a changed route or a missing launch shows here);
2. that every kernel fits an sm_90 SM (shared memory <= 227 KiB, registers x threads <= 65,536);
3. no local memory (the stack frame, where ptxas puts spills and local arrays): 0 bytes per thread, or for the
   kernels that have some today, at most what they have (LOCAL_MEMORY_BYTES, each entry says why).
`pytest -s` prints one resource row per compiled kernel (CompiledKernel.row).

Shapes (V41Config): hidden 5,120, 4 hyper-connection streams, 384 routed experts top-6 (intermediate 2,304), norms of
q 1,280 / kv 512 / index keys 128, RoPE on the last 64 dims, 64 heads of 512, 32 indexer heads of 128, vocabulary
129,280; a prefill step of 4,096 tokens and decode steps of 64 and 256 rows. Inputs whose values no host code reads
are torch.empty (never touched: nothing runs); index inputs are valid anyway (zeros / arange), so that a future host
read of them still sees a sound routing.

One route is decided by a tensor's device.type, which cuda_like does not fake (still "cpu"), and is forced to its
CUDA choice by a monkeypatch in the case concerned: linear_fp32.split_grid (the gate's split, in moe_route_fused).

Not here: the head at prefill (the engine computes logits of one sample row per sequence, decode-sized), and the
NVSHMEM dispatch / combine kernels of mini-deepep (packages/mini-deepep/tools/kernel_registers.py compiles those
offline).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels are interpreted functions then: nothing compiles
    pytest.skip("TRITON_INTERPRET=1: the kernels do not compile", allow_module_level=True)
triton = pytest.importorskip("triton")

from mini_deepinfer.layers import (  # noqa: E402 (after the skips: imported only where triton is)
    engram_kernels,
    entry_rows,
    hyper_connections,
    linear_fp32,
    moe_kernels,
    moe_route,
    rmsnorm,
    rope,
    sampler,
)
from mini_deepep.layout import get_dispatch_layout  # noqa: E402
from mini_deepgemm import get_m_alignment_for_contiguous_layout  # noqa: E402
from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE  # noqa: E402
from mini_deepinfer.models.deepseek_v41.config import V41Config  # noqa: E402
from mini_deepinfer.models.deepseek_v41.moe import MASKED_MAX_TOKENS, max_rows  # noqa: E402

from sm90_compile import compiling_for_sm90  # noqa: E402

CFG = V41Config()  # the defaults are DeepSeek-V4.1-Flash's
HIDDEN = CFG.hidden_size  # 5,120
HC = CFG.hc_mult  # 4 streams
EXPERTS = CFG.n_routed_experts  # 384
TOPK = CFG.num_experts_per_tok  # 6
INTER = CFG.moe_intermediate_size  # 2,304
ROPE_HALF = CFG.qk_rope_head_dim // 2  # 32 frequencies: the last 64 dims rotate
CONTIGUOUS_ALIGN = get_m_alignment_for_contiguous_layout()  # each expert segment's row alignment (moe._plan's)
TABLE_WIDTH = 1025  # KV blocks of a 131k-token context's block table (+1), as runtime/tests/test_entry_rows.py
PREFILL = 4096
DECODE = (64, 256)
STEPS = {f"prefill{PREFILL}": PREFILL, **{f"decode{rows}": rows for rows in DECODE}}

# (entry point: a case id's first part, kernel) -> most local-memory bytes per thread (its stack frame)
# allowed, for every shape of that entry point: the kernels that have some today, at the most they have under triton
# 3.6 and 3.9 (ptxas -v of each, TRITON_DUMP_PTXAS_LOG=1, quoted). Every other kernel must have none.
LOCAL_MEMORY_BYTES: dict[tuple[str, str], int] = {
    # libdevice's cosf / sinf (LIBDEVICE=True): their slow-path argument reduction (|angle| > 105615, positions x
    # frequencies reach it) keeps its words in a local array. 3.6, every rope shape: "32 bytes stack frame, 0 bytes
    # spill stores". 3.9: q (64 heads of 512) "8 bytes stack frame, 4 bytes spill stores" (40 registers), the others
    # none (where 3.9's 4 spilled bytes sit in the code was not looked at)
    ("rope", "rope_kernel"): 32,
    # the collapse's fp32 accumulator beside the expand's tile, as hyper_connections._launch_expand's comment measured:
    # 128 registers and a few words spilled once per thread (3.6: "16 bytes stack frame, 16 bytes spill stores"; 3.9:
    # 8 and 8). The 256-wide tile would need 255 registers and spill as much
    ("hc_expand_collapse", "hc_expand_kernel"): 16,
}


def bf16(*shape: int) -> torch.Tensor:
    """A bf16 activation or weight whose values nothing reads (no kernel runs); cuda_like inside the harness."""
    return torch.empty(shape, dtype=torch.bfloat16)


def fp32(*shape: int) -> torch.Tensor:
    """An fp32 tensor whose values nothing reads."""
    return torch.empty(shape, dtype=torch.float32)


def routing(tokens: int, num_experts: int = EXPERTS) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids int64 [T, 6], distinct per token and spread over the experts; weights fp32 [T, 6]), as moe_route
    returns them."""
    ids = (torch.arange(tokens)[:, None] * TOPK + torch.arange(TOPK)[None, :]) % num_experts
    return ids, torch.full((tokens, TOPK), 1.0 / TOPK)


def pair_rows(tokens: int) -> torch.Tensor:
    """int64 [T, 6]: each (token, slot) pair's row of an expert-sorted layout (distinct, in range)."""
    return torch.arange(tokens * TOPK).view(tokens, TOPK)


def layout_rows(tokens: int) -> int:
    """Rows of the MoE layout a step of `tokens` tokens uses: masked (T per expert) up to MASKED_MAX_TOKENS, else
    contiguous (moe.moe_grouped's choice)."""
    if tokens <= MASKED_MAX_TOKENS:
        return EXPERTS * tokens
    return max_rows(tokens * TOPK, EXPERTS, CONTIGUOUS_ALIGN)


# --------------------------------------------------------------------------- the calls, one entry point each
def call_rmsnorm(tokens: int, dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rmsnorm.rmsnorm_fused(bf16(tokens, dim), bf16(dim), CFG.rms_norm_eps)


def call_engram_operand(tokens: int, fold: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """wkv's operand: 24 table rows of 256 per token (e4m3 with UE8M0 per 32), per 32 or folded per 128."""
    rows = CFG.n_engram_orders * CFG.engram_n_heads
    table = torch.empty(1000, CFG.engram_head_dim, dtype=torch.float8_e4m3fn)
    scale = torch.empty(1000, CFG.engram_head_dim // 32, dtype=torch.uint8)
    engram_kernels.engram_operand(table, scale, torch.zeros(tokens, rows, dtype=torch.int64), fold)


def call_engram_gate(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Engram gate after wkv (output [T, 5 x 5,120]: four keys, then the value)."""
    engram_kernels.engram_gate_fused(bf16(tokens, HC, HIDDEN), bf16(tokens, (HC + 1) * HIDDEN), bf16(HC, HIDDEN),
                                     bf16(HC, HIDDEN), CFG.rms_norm_eps)


def call_rope(tokens: int, heads: int, head_dim: int, inverse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """heads 0: a [T, head_dim] tensor (the window kv, the index keys), else [T, heads, head_dim]."""
    x = bf16(tokens, head_dim) if heads == 0 else bf16(tokens, heads, head_dim)
    rope.rope_fused_(x, torch.arange(tokens), fp32(ROPE_HALF), inverse)


def call_hc_mixes(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    hyper_connections.hc_mixes_fused(bf16(tokens, HC, HIDDEN), fp32(CFG.hc_mix_dim, HC * HIDDEN), fp32(3),
                                     fp32(CFG.hc_mix_dim), CFG)


def call_hc_collapse(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    hyper_connections.hc_collapse_fused(bf16(tokens, HC, HIDDEN), fp32(tokens, HC))


def call_hc_expand(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    hyper_connections.hc_expand_fused(bf16(tokens, HIDDEN), bf16(tokens, HC, HIDDEN), fp32(tokens, HC),
                                      fp32(tokens, HC, HC))


def call_hc_expand_collapse(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    hyper_connections.hc_expand_collapse_fused(bf16(tokens, HIDDEN), bf16(tokens, HC, HIDDEN), fp32(tokens, HC),
                                               fp32(tokens, HC, HC), fp32(tokens, HC))


def call_moe_route(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """moe_route_fused with split_grid deciding as for a CUDA x (module docstring)."""
    split_grid = linear_fp32.split_grid
    monkeypatch.setattr(linear_fp32, "split_grid", lambda T, N, device: split_grid(T, N, torch.device("cuda")))
    moe_route.moe_route_fused(bf16(tokens, HIDDEN), bf16(EXPERTS, HIDDEN), fp32(EXPERTS), TOPK, CFG.gate_temp,
                              CFG.routed_scaling_factor)


def call_linear_fp32(tokens: int, out_features: int, monkeypatch: pytest.MonkeyPatch) -> None:
    linear_fp32.linear_fp32(bf16(tokens, HIDDEN), bf16(out_features, HIDDEN))


def call_masked_plan(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    moe_kernels.masked_plan(*routing(tokens), EXPERTS)


def call_contiguous_plan(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    moe_kernels.contiguous_plan(*routing(tokens), EXPERTS, CONTIGUOUS_ALIGN, layout_rows(tokens))


def call_quant_scatter(tokens: int, fold_128: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    moe_kernels.quant_scatter(bf16(tokens, HIDDEN), pair_rows(tokens), layout_rows(tokens), fold_128)


def call_swiglu_listed(tokens: int, fold_128: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The routed experts' SwiGLU over the real rows (moe.grouped_expert_ffn: rows = the plan's pair_row)."""
    rows = layout_rows(tokens)
    moe_kernels.swiglu_weight_quant(bf16(rows, 2 * INTER), fp32(rows), CFG.swiglu_limit, rows=pair_rows(tokens),
                                    fold_128=fold_128)


def call_swiglu_layout(tokens: int, fold_128: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The EP path's SwiGLU over every row of a contiguous layout, padding marked -1 in grouped_layout."""
    rows = layout_rows(tokens)
    layout = torch.full((rows,), -1, dtype=torch.int32)
    moe_kernels.swiglu_weight_quant(bf16(rows, 2 * INTER), fp32(rows), CFG.swiglu_limit, grouped_layout=layout,
                                    fold_128=fold_128)


def call_swiglu_shared(tokens: int, fold_128: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared expert's SwiGLU: every row real, unweighted (moe.shared_expert)."""
    moe_kernels.swiglu_weight_quant(bf16(tokens, 2 * INTER), None, CFG.swiglu_limit, fold_128=fold_128)


def call_combine(tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    moe_kernels.combine(bf16(layout_rows(tokens), HIDDEN), pair_rows(tokens), bf16(tokens, HIDDEN))


def call_entry_rows(rows: int, ratio: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode indexer's key rows of a publisher of `ratio` at 131k context: every row's table full."""
    per_block = BLOCK_SIZE // ratio
    tables = torch.arange(rows * TABLE_WIDTH).view(rows, TABLE_WIDTH)
    n_cap = TABLE_WIDTH * per_block
    entry_rows.visible_entry_rows(tables, torch.full((rows,), n_cap), per_block, n_cap)


def call_sample(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """sampler.sample with no top-k / top-p (the Gumbel-max kernels only); greedy and sampled rows mixed (one kernel
    serves both: the temperature is a runtime value)."""
    batch = sampler.SamplingBatch(
        temperatures=torch.arange(rows, dtype=torch.float64) % 2, top_k=torch.full((rows,), -1),
        top_p=torch.ones(rows), seeds=torch.arange(rows),
        positions=torch.zeros(rows, dtype=torch.int64), needs_filter=False)
    sampler.sample(fp32(rows, CFG.vocab_size), batch)


def call_dispatch_layout(tokens: int, num_ranks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    get_dispatch_layout(routing(tokens)[0], EXPERTS, num_ranks)


# --------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    """One entry-point call: its id, the call (given the test's monkeypatch) and the kernels it must compile, in
    launch order; xfail: why it does not compile or fit today (a strict xfail)."""

    id: str
    call: Callable[[pytest.MonkeyPatch], None]
    kernels: tuple[str, ...]
    xfail: str | None = None


def bind(fn: Callable[..., None], *args: object) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda monkeypatch: fn(*args, monkeypatch)


RMSNORM = ("rmsnorm_kernel",)
ROPE = ("rope_kernel",)
HC_MIXES = ("hc_mix_partial_kernel", "hc_mix_finish_kernel")
HC_EXPAND = ("hc_expand_kernel",)
ROUTE = ("_linear_fp32_kernel", "moe_route_kernel")  # the gate's planes, then the routing tail
LINEAR = ("_linear_fp32_kernel",)
PLAN = ("plan_fill_kernel", "plan_count_kernel", "plan_offsets_kernel", "plan_place_kernel")
SCATTER = ("quant_scatter_kernel",)
SWIGLU = ("swiglu_weight_quant_kernel",)
LAYOUT = ("layout_block_kernel", "layout_offsets_kernel")
SAMPLE = ("_gumbel_argmax_slice_kernel", "_best_slice_kernel")
# rope inputs: name -> (heads (0: a [T, D] tensor), head dim, inverse)
ROPE_INPUTS = {"q": (CFG.num_attention_heads, CFG.head_dim, False), "kv": (0, CFG.head_dim, False),
               "index-q": (CFG.index_n_heads, CFG.index_head_dim, False), "index-k": (0, CFG.index_head_dim, False),
               "o-inverse": (CFG.num_attention_heads, CFG.head_dim, True)}
NORMS = {"hidden": HIDDEN, "q": CFG.q_lora_rank, "kv": CFG.head_dim, "index-k": CFG.index_head_dim}


def cases() -> list[Case]:
    out: list[Case] = []
    for step, tokens in STEPS.items():
        out += [Case(f"rmsnorm/{name}{dim}/{step}", bind(call_rmsnorm, tokens, dim), RMSNORM)
                for name, dim in NORMS.items()]
        out += [Case(f"rope/{name}/{step}", bind(call_rope, tokens, *shape), ROPE)
                for name, shape in ROPE_INPUTS.items()]
        out += [
            Case(f"hc_mixes/{step}", bind(call_hc_mixes, tokens), HC_MIXES),
            Case(f"hc_collapse/{step}", bind(call_hc_collapse, tokens), ("hc_collapse_kernel",)),
            Case(f"hc_expand/{step}", bind(call_hc_expand, tokens), HC_EXPAND),
            Case(f"hc_expand_collapse/{step}", bind(call_hc_expand_collapse, tokens), HC_EXPAND),
            Case(f"moe_route/{step}", bind(call_moe_route, tokens), ROUTE),
            # the compressor's fp32 projections of ratio-2 layers (ops.compressor_project: wkv, wgate [512, 5120])
            Case(f"linear_fp32/compressor/{step}", bind(call_linear_fp32, tokens, CFG.head_dim), LINEAR),
            Case(f"combine/{step}", bind(call_combine, tokens), ("combine_kernel",)),
            Case(f"engram_gate/{step}", bind(call_engram_gate, tokens), ("engram_gate_kernel",)),
        ]
        out += [Case(f"engram_operand/{step}{'/fold128' if fold else ''}", bind(call_engram_operand, tokens, fold),
                     ("engram_operand_kernel",)) for fold in (False, True)]
        plan = call_masked_plan if tokens <= MASKED_MAX_TOKENS else call_contiguous_plan  # moe.moe_grouped's choice
        out.append(Case(f"{plan.__name__.removeprefix('call_')}/{step}", bind(plan, tokens), PLAN))
        for fold in (False, True):  # fold_128: the experts' GEMMs on the FP8-MMA route (moe.folds_activations)
            suffix = "/fold128" if fold else ""
            out += [
                Case(f"quant_scatter/{step}{suffix}", bind(call_quant_scatter, tokens, fold), SCATTER),
                Case(f"swiglu/listed/{step}{suffix}", bind(call_swiglu_listed, tokens, fold), SWIGLU),
                Case(f"swiglu/shared/{step}{suffix}", bind(call_swiglu_shared, tokens, fold), SWIGLU),
            ]
            if tokens == PREFILL:  # the EP path's contiguous layout (no list of real rows)
                out.append(Case(f"swiglu/ep-layout/{step}{suffix}", bind(call_swiglu_layout, tokens, fold), SWIGLU))
        for num_ranks in (2, 8):  # EP over 2 GPUs (test_ep_dp_gpu) and over an 8-GPU host
            out.append(Case(f"dispatch_layout/ep{num_ranks}/{step}", bind(call_dispatch_layout, tokens, num_ranks),
                            LAYOUT))
    # Entry points of decode rows only: the head and the sampler see one row per sequence (model.py: final_logits of
    # sample_rows), the indexer's key rows are _indexer_decode's
    for rows in DECODE:
        out += [
            Case(f"linear_fp32/head/decode{rows}", bind(call_linear_fp32, rows, CFG.vocab_size), LINEAR),
            Case(f"sample/decode{rows}", bind(call_sample, rows), SAMPLE),
        ]
        out += [Case(f"entry_rows/ratio{ratio}/decode{rows}", bind(call_entry_rows, rows, ratio),
                     ("visible_entry_rows_kernel",)) for ratio in (1, 2)]
    return out


def params() -> list:
    return [pytest.param(case, id=case.id, marks=[pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail
                         else []) for case in cases()]


@pytest.mark.parametrize("case", params())
def test_compiles_for_sm90_and_fits(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    with compiling_for_sm90() as kernels:
        case.call(monkeypatch)
    for k in kernels:
        print(k.row(case.id))
    assert tuple(k.name for k in kernels) == case.kernels
    assert [p for k in kernels for p in k.fits()] == []
    local = {k.name: k.local_bytes for k in kernels
             if k.local_bytes > LOCAL_MEMORY_BYTES.get((case.id.split("/")[0], k.name), 0)}
    assert local == {}, "kernel: local bytes per thread beyond LOCAL_MEMORY_BYTES"
