"""mini_flashmla's public API: sparse MLA attention with sink (bf16 or the paged quantized V4.1 cache) and the
indexer (scores, top-k, candidate blocks).

Every function runs a Triton kernel when its tensors are on CUDA and Triton is importable (the attention: a Gluon
kernel where `_gluon_runs_on` allows, on Hopper with triton 3.6), and otherwise the pure-torch reference in
`mini_flashmla.reference` (same arguments, same results within the stated tolerances), so the CPU path is also the
oracle. Shapes use FlashMLA's names: s_q query tokens (all sequences of a batch
flattened, no batch dimension), h heads, d = 512 (RoPE on the last 64 dims), topk index slots per query.

Cache layouts (cache_layout.py, V41_MODEL.md section 5): rows of uint8 addressed by flat row ids.
- window ring: [num_rows_w, 528], FP8 e4m3 x 512 then UE8M0 per 32; the runtime's row of (slot, pos) is
  slot * 128 + pos % 128.
- compressed KV: [num_rows_c, 288], FP4 e2m1 x 512 (low nibble = even dim) then e4m3 per 16; entry g of a sequence
  is row block_table[g // epb] * epb + g % epb with epb = 128 // ratio entries per block.
- index keys: [num_rows_k, 68], FP4 e2m1 x 128 then UE8M0 per 32, addressed like the compressed KV.
"""

from __future__ import annotations

import functools
import math
import os

import torch
from mini_deepgemm._backend import gluon_runs_on, sm_count

from mini_flashmla import reference
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, INDEX_K_ROW_BYTES, WINDOW_ROW_BYTES

HEAD_DIM = 512
INDEX_HEAD_DIM = 128
ATTN_BLOCK_N = reference.SPARSE_ATTN_BLOCK  # the kernel walks indices in the reference's blocks of 64
MAX_ATTN_BLOCK_H = 64  # heads per attention program (tensor-core M); h > 64 uses several programs
# Launch options of the attention kernel for 64-head programs, by row format (measured on H200,
# docs/reports/flashmla-sparse-attention.md): 8 warps hold the 64 x 512 fp32 accumulator in two warpgroups. bf16
# rows pipeline their gathers over 2 stages (cp.async, +20%); quantized rows do not gain from it (the
# dequantization sits between the load and the MMA: -6%). Smaller head blocks use 4 warps, 1 stage. Off sm_90 bf16
# rows take 1 stage too (_attn_launch).
ATTN_LAUNCH_64_HEADS = {"bf16": {"num_warps": 8, "num_stages": 2}, "quantized": {"num_warps": 8, "num_stages": 1}}
# Indexer scores per query chunk are fp32 [chunk, n_keys]: 256 MiB at this size bounds the transient memory.
INDEXER_CHUNK_BYTES = 256 << 20
# The indexer's per-query (decode) launch: key tile, pipelining depth of the key loads, warps, and the programs per
# SM that each program's run of keys aims for (indexer_kernel.indexer_scores_per_query_kernel). Session 14 run 4
# (benchmarks/exp_indexer_tiles.py --per-query; batch 64 / 256, 65,536 keys each): 128 keys, no software
# pipelining (several programs per SM hide the loads), 4 warps, 4 programs per SM: 0.270 / 0.900 ms (2 stages
# 0.290 / 0.974, 64 keys 0.299 / 1.065, 8 warps 0.374 / 1.352; the previous launch 0.747 / 2.978). Session 15
# run 2, with the queries on the grid's x axis: 0.235 / 0.912 ms, the same ranking.
INDEXER_PER_QUERY_BLOCK_K = 128
INDEXER_PER_QUERY_STAGES = 1
INDEXER_PER_QUERY_WARPS = 4
INDEXER_PER_QUERY_PROGRAMS_PER_SM = 4


@functools.cache
def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreting() -> bool:
    """TRITON_INTERPRET=1 runs the kernels on CPU tensors (slowly): how the kernels are checked without a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _use_kernel(*tensors: torch.Tensor) -> bool:
    return _triton_ok() and (all(t.is_cuda for t in tensors) or _interpreting())


def _num_sms(device: torch.device) -> int:
    """SM count of a CUDA device; 8 stands in for the CPU when the kernels run under the interpreter."""
    return sm_count(device) if device.type == "cuda" else 8


# --------------------------------------------------------------------------- sparse attention
def sparse_mla_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention over one shared K=V head of bf16 rows (prefill; same semantics as
    reference.sparse_attn_ref).

    Args:
        q: bf16 [s_q, h, 512], last dim contiguous; any h (h > 64 runs in blocks of 64 heads).
        kv: bf16 [n_kv, 512], contiguous; K and V are the same rows.
        indices: int32 [s_q, topk], rows of kv; -1 (or any id outside [0, n_kv)) = empty slot.
        sm_scale: softmax scale (V4.1: 512 ** -0.5).
        attn_sink: fp32 [h] or None; exp(sink) is added to the softmax denominator only.
    Returns:
        out: bf16 [s_q, h, 512]; a row whose indices are all empty is 0. An empty slot contributes nothing
            whatever kv holds: a NaN or inf in kv reaches only the queries that select its row.
        lse: fp32 [s_q, h], natural log-sum-exp of the scaled scores over the valid slots, without the sink;
            -inf for an all-empty row.
    Numerics: fp32 scores from bf16 operands, online softmax over blocks of 64 slots, P rounded to bf16 before
    P.V, fp32 accumulation. Matches the reference within bf16 rounding (see tests for the metric).
    """
    if not _use_kernel(q, kv, indices):
        return reference.sparse_attn_ref(q, kv, indices, sm_scale, attn_sink)
    from mini_flashmla.sparse_attn_kernel import FORMAT_BF16

    _check_attn_inputs(q, attn_sink)
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM or kv.dtype != torch.bfloat16:
        raise ValueError(f"kv must be bf16 [n_kv, {HEAD_DIM}], got {kv.dtype} {tuple(kv.shape)}")
    source = (kv.contiguous(), indices, FORMAT_BF16.value)
    if _gluon_runs_on(q, source[0]):
        return _launch_gluon(q, source, None, sm_scale, attn_sink)
    return _launch_sparse_attn(q, source, None, sm_scale, attn_sink, 1)


def sparse_mla_fwd_paged(
    q: torch.Tensor,
    window_cache: torch.Tensor,
    compressed_cache: torch.Tensor | None,
    window_ids: torch.Tensor,
    compressed_ids: torch.Tensor | None,
    sm_scale: float,
    attn_sink: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention reading the quantized paged cache directly (prefill and decode).

    Args:
        q: bf16 [s_q, h, 512]: every query token of the batch, flattened.
        window_cache: uint8 [num_rows_w, 528] (cache_layout.pack_window_fp8 rows).
        compressed_cache: uint8 [num_rows_c, 288] (cache_layout.pack_compressed_kv_fp4 rows), or None for
            window-only layers.
        window_ids: int32 [s_q, W] flat rows of window_cache; -1 = empty.
        compressed_ids: int32 [s_q, topk] flat rows of compressed_cache; -1 = empty; None with compressed_cache.
        sm_scale: softmax scale (512 ** -0.5).
        attn_sink: fp32 [h] or None.
        num_splits: how many parts the index list of each query is cut into (decode: few queries, long lists);
            None picks enough to fill the GPU. Parts are merged by their lse.
    Returns:
        (out bf16 [s_q, h, 512], lse fp32 [s_q, h]) equal to
        reference.sparse_attn_paged_ref(...): sparse_attn_ref over the dequantized rows, window slots first, then
        compressed slots. Rows are dequantized in the kernel exactly as cache_layout's unpack functions. An empty
        slot contributes nothing whatever the caches hold (as in sparse_mla_fwd).
    """
    if not _use_kernel(q, window_cache, window_ids):
        return reference.sparse_attn_paged_ref(q, window_cache, compressed_cache, window_ids, compressed_ids,
                                               sm_scale, attn_sink)
    from mini_flashmla.sparse_attn_kernel import FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW

    _check_attn_inputs(q, attn_sink)
    _check_rows(window_cache, WINDOW_ROW_BYTES, "window_cache")
    source_b = None
    if compressed_cache is not None:
        _check_rows(compressed_cache, COMPRESSED_KV_ROW_BYTES, "compressed_cache")
        source_b = (compressed_cache, compressed_ids, FORMAT_FP4_COMPRESSED.value)
    total_slots = window_ids.shape[1] + (compressed_ids.shape[1] if compressed_ids is not None else 0)
    source_a = (window_cache, window_ids, FORMAT_FP8_WINDOW.value)
    gluon = _gluon_runs_on(q, *(c for c in (window_cache, compressed_cache) if c is not None))
    if num_splits is None:
        num_splits = _default_num_splits(q, total_slots)
    if gluon:
        return _launch_gluon(q, source_a, source_b, sm_scale, attn_sink, num_splits)
    return _launch_sparse_attn(q, source_a, source_b, sm_scale, attn_sink, num_splits)


def _check_attn_inputs(q: torch.Tensor, attn_sink: torch.Tensor | None) -> None:
    if q.dim() != 3 or q.shape[2] != HEAD_DIM or q.dtype != torch.bfloat16 or q.stride(2) != 1:
        raise ValueError(f"q must be bf16 [s_q, h, {HEAD_DIM}] with a contiguous last dim, got {q.dtype} "
                         f"{tuple(q.shape)}")
    if attn_sink is not None and attn_sink.shape != (q.shape[1],):
        raise ValueError(f"attn_sink must be [h={q.shape[1]}], got {tuple(attn_sink.shape)}")


def _check_rows(cache: torch.Tensor, row_bytes: int, name: str) -> None:
    if cache.dtype != torch.uint8 or cache.dim() != 2 or cache.shape[1] != row_bytes or not cache.is_contiguous():
        raise ValueError(f"{name} must be contiguous uint8 [rows, {row_bytes}], got {cache.dtype} "
                         f"{tuple(cache.shape)}")


def _default_num_splits(q: torch.Tensor, total_slots: int) -> int:
    """Split a grid of fewer programs than SMs (decode) up to ~1 program per SM, down to one block of 64 slots per
    split, for either kernel. Evidence, V4.1's 640 slots: the Gluon kernel at batch 8 on H200, 1.10x two splits
    (docs/reports/flashmla-gluon.md, session 27); the Triton kernel on an H100 (session 76, split sweep) at batch 64,
    59.7 us in 2 splits against 82.9 unsplit, at batch 8 21.7 us in 10 against 24.8 in 5, and slower split from batch
    128 (docs/reports/triton-route-on-hopper.md, "Session 76")."""
    programs = q.shape[0] * math.ceil(q.shape[1] / MAX_ATTN_BLOCK_H)
    blocks = math.ceil(total_slots / ATTN_BLOCK_N)
    return max(1, min(_num_sms(q.device) // max(programs, 1), blocks))


def _split_blocks(n_blocks: int, num_splits: int) -> tuple[int, int]:
    """(splits, blocks per split) for cutting n_blocks into at most num_splits parts, none of them empty."""
    num_splits = max(1, min(num_splits, n_blocks))
    blocks_per_split = math.ceil(n_blocks / num_splits) if n_blocks else 0
    return (math.ceil(n_blocks / blocks_per_split) if n_blocks else 1), blocks_per_split


def _walk_blocks(a_len: int, b_len: int) -> int:
    """Blocks of ATTN_BLOCK_N slots in a query's walk: source A's index list, then source B's (b_len 0: none)."""
    return math.ceil(a_len / ATTN_BLOCK_N) + math.ceil(b_len / ATTN_BLOCK_N)


def _sink_arg(attn_sink: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The kernels' sink argument: fp32 [h], or a placeholder they do not read (HAS_SINK false)."""
    return attn_sink.float().contiguous() if attn_sink is not None else placeholder


def _split_partials(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernels' partial outputs: normalised out bf16 [s_q, num_splits, h, 512] (half the bytes of fp32, which
    the split decode writes and the combine reads back; docs/reports/flashmla-gluon.md, "Session 62"), lse fp32 [s_q,
    num_splits, h]."""
    s_q, h, d = q.shape
    return (torch.empty((s_q, num_splits, h, d), dtype=torch.bfloat16, device=q.device),
            torch.empty((s_q, num_splits, h), dtype=torch.float32, device=q.device))


def _combine_splits(part_out, part_lse, sink, has_sink: bool, out, lse):
    """out, lse from the partials (sparse_attn_kernel.combine_splits_kernel: merged by lse, then the sink, the
    launcher's _sink_arg)."""
    from mini_flashmla.sparse_attn_kernel import combine_splits_kernel

    s_q, num_splits, h, d = part_out.shape
    block_d = 128  # 4 programs per (query, 16 heads) at d = 512: a small decode batch still fills the SMs
    # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
    # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
    combine_splits_kernel[(s_q, math.ceil(h / 16), d // block_d)](
        part_out, part_lse, sink, out, out.stride(0), out.stride(1), lse, lse.stride(0), h, num_splits,
        HAS_SINK=has_sink, BLOCK_H=16, D=d, BLOCK_D=block_d, num_warps=4,
        enable_fp_fusion=True,
    )


_INT32_MAX = 2**31 - 1  # the largest offset the kernels' 32-bit address terms hold (_q_for_kernels, _rows_per_launch)
_MAX_GRID_Y = 65535  # CUDA's limit on a launch grid's y (and z) axis


def _q_for_kernels(q: torch.Tensor) -> torch.Tensor:
    """q as the attention and indexer kernels read it: they form a head's offset (head x q.stride(1)) in 32 bits (in
    64 bits: a spill in the split Gluon attention, offline; the indexer's scores 0.95x with its query and head
    offsets both 64-bit, session 65). So a q whose head offsets pass 2**31 (a head-major view, x[h, s_q,
    d].transpose(0, 1): attention from s_q = 66,577 at 64 heads of 512, the indexer from 541,201 at 32 heads of 128)
    is copied into the contiguous layout (head stride d); any other q is passed as it is."""
    return q.contiguous() if q.stride(1) * max(q.shape[1] - 1, 0) + q.shape[2] > _INT32_MAX else q


def _launch_views(rows: int, *per_query: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """per_query (tensors indexed by query first) for kernel launches of at most `rows` queries: as they are where one
    launch covers them, else as views of consecutive chunks."""
    s_q = per_query[0].shape[0]
    if s_q <= rows:
        return [per_query]
    return [tuple(t[q0:q0 + rows] for t in per_query) for q0 in range(0, s_q, rows)]


def _rows_per_launch(*row_strides: int) -> int:
    """Queries per launch that keep a query's offsets (query x a row stride, which the attention and indexer kernels
    form in 32 bits: in 64, the Triton attention kernel spilled 88 more bytes under triton 3.9, and the indexer's
    scores ran 0.95x with its query and head offsets both 64-bit, session 65) below 2**31, e.g. 16,383 queries of
    131,072 slots' ids."""
    return _INT32_MAX // max(*row_strides, 1)


def _attn_launch_views(q, a_ids, b_ids, out, lse, part_out, part_lse) -> list[tuple[torch.Tensor, ...]]:
    """An attention call's per-query operands, as (q, a_ids, b_ids, out, lse, part_out, part_lse) per launch: one
    launch unless a query's offset into either ids tensor would pass 2**31 (_rows_per_launch, _launch_views); both
    kernels, Triton and Gluon, form those offsets alike."""
    return _launch_views(_rows_per_launch(a_ids.stride(0), b_ids.stride(0)), q, a_ids, b_ids, out, lse, part_out,
                         part_lse)


def _attn_operands(q, source_a, source_b):
    """The kernels' q (_q_for_kernels), the outputs (out bf16 [s_q, h, 512], lse fp32 [s_q, h]) and both sources with
    int32 contiguous ids, after checking the index shapes; a missing source B repeats A (a placeholder the kernels do
    not read: HAS_B false)."""
    s_q, h, d = q.shape
    out = torch.empty((s_q, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((s_q, h), dtype=torch.float32, device=q.device)
    for source in (source_a, source_b):
        if source is not None and (source[1].dim() != 2 or source[1].shape[0] != s_q):
            raise ValueError(f"index tensors must be [s_q={s_q}, n], got {tuple(source[1].shape)}")
    a_rows, a_ids, a_format = source_a
    source_a = (a_rows, a_ids.to(torch.int32).contiguous(), a_format)
    if source_b is not None:
        source_b = (source_b[0], source_b[1].to(torch.int32).contiguous(), source_b[2])
    return _q_for_kernels(q), out, lse, source_a, source_b if source_b is not None else source_a


def _launch_sparse_attn(q, source_a, source_b, sm_scale, attn_sink, num_splits):
    """source_*: (rows tensor, ids int32 [s_q, n], FORMAT). Allocates the outputs and launches the kernel(s)."""
    from mini_flashmla.sparse_attn_kernel import FORMAT_BF16, LOG2E, sparse_mla_fwd_kernel

    s_q, h, d = q.shape
    q, out, lse, (a_rows, a_ids, a_format), (b_rows, b_ids, b_format) = _attn_operands(q, source_a, source_b)
    if s_q == 0 or h == 0:
        return out, lse
    n_blocks = _walk_blocks(a_ids.shape[1], b_ids.shape[1] if source_b is not None else 0)
    num_splits, blocks_per_split = _split_blocks(n_blocks, num_splits)
    block_h = min(MAX_ATTN_BLOCK_H, max(16, _next_pow2(h)))  # tensor-core M must be >= 16
    sink = _sink_arg(attn_sink, lse)
    split = num_splits > 1
    part_out, part_lse = _split_partials(q, num_splits) if split else (out, lse)  # placeholders unsplit
    for c_q, c_a_ids, c_b_ids, c_out, c_lse, c_part_out, c_part_lse in _attn_launch_views(
            q, a_ids, b_ids, out, lse, part_out, part_lse):
        sparse_mla_fwd_kernel[(c_q.shape[0], math.ceil(h / block_h), num_splits)](
            c_q, q.stride(0), q.stride(1),
            a_rows, c_a_ids, a_ids.stride(0), a_ids.shape[1], a_rows.shape[0],
            b_rows, c_b_ids, b_ids.stride(0), b_ids.shape[1], b_rows.shape[0],
            sink, c_out, out.stride(0), out.stride(1), c_lse, lse.stride(0), c_part_out, c_part_lse,
            h, num_splits, blocks_per_split, sm_scale * LOG2E.value,
            A_FORMAT=a_format, B_FORMAT=b_format, HAS_B=source_b is not None, HAS_SINK=attn_sink is not None,
            SPLIT=split, BLOCK_H=block_h, BLOCK_N=ATTN_BLOCK_N, D=d, FP4_ASM=q.is_cuda,
            **_attn_launch(a_format == FORMAT_BF16.value, block_h, q), enable_fp_fusion=True,
        )
    if split:
        _combine_splits(part_out, part_lse, sink, attn_sink is not None, out, lse)
    return out, lse


def _attn_launch(bf16_rows: bool, block_h: int, q: torch.Tensor) -> dict[str, int]:
    """num_warps and num_stages of sparse_mla_fwd_kernel: ATTN_LAUNCH_64_HEADS for 64-head programs, except bf16 rows
    on a GPU other than sm_90, which take 1 stage. On sm_100a their 2 stages need 262,944 B of shared memory, more than
    a program may have (232,448 B); on sm_90, 196,864 B (offline compiles under triton 3.6 and 3.9, session 51:
    integration_tests/test_compile_sm100.py). The 1-stage launch was neither run nor timed on an sm_100 GPU."""
    if block_h != MAX_ATTN_BLOCK_H:
        return {"num_warps": 4, "num_stages": 1}
    launch = ATTN_LAUNCH_64_HEADS["bf16" if bf16_rows else "quantized"]
    if bf16_rows and q.is_cuda and torch.cuda.get_device_capability(q.device) != (9, 0):
        return {**launch, "num_stages": 1}
    return launch


def _gluon_runs_on(q: torch.Tensor, *caches: torch.Tensor) -> bool:
    """Where sparse_attn_gluon_kernel takes a call (split or not): whole programs of 64 heads, rows in every given
    cache, 16-byte aligned caches and query rows (its cp.async copies are 16 B), where
    mini_deepgemm's Gluon platform check allows (sm_90, triton 3.6, not the interpreter).
    Until session 13 calls of fewer programs than SMs (decode at batch 64 and 128 on H200) stayed on the Triton
    kernel: timed with host time included (do_bench), the Gluon kernel's decode looked unstable (59-64 us in one
    run, 125-142 us in another). By CUDA-graph replay, as the engine's decode runs, it is 49.2 / 56.3 us against the
    Triton kernel's 82.2 / 95.7 us at batch 64 / 128 (session 13 run 3; docs/reports/flashmla-gluon.md): the
    unstable figures were the launch's host time."""
    return (q.shape[1] % MAX_ATTN_BLOCK_H == 0 and gluon_runs_on(q)
            and all(c.shape[0] > 0 and c.data_ptr() % 16 == 0 for c in caches)
            and q.data_ptr() % 16 == 0 and q.stride(0) % 8 == 0 and q.stride(1) % 8 == 0)


def _launch_gluon(q, source_a, source_b, sm_scale, attn_sink, num_splits=1, trace=None):
    """A call on sparse_attn_gluon_kernel (see _gluon_runs_on for when); source_* as in _launch_sparse_attn; split
    into up to num_splits parts of each query's blocks, merged by _combine_splits. Same outputs as the Triton kernel
    within the rounding of the accumulation order. trace: None, or int64 [programs, 4, 64] that gets the kernel's
    event trace (the kernel module's _mark; benchmarks/exp_flashmla_trace.py reads it; a call that _launch_views
    splits into several launches writes each launch's programs over the last's)."""
    from mini_flashmla.sparse_attn_gluon_kernel import LOG2E, MAXNREG, sparse_mla_fwd_gluon_kernel

    s_q, h, d = q.shape
    q, out, lse, (a_rows, a_ids, a_format), (b_rows, b_ids, b_format) = _attn_operands(q, source_a, source_b)
    if s_q == 0:
        return out, lse
    b_len = b_ids.shape[1] if source_b is not None else 0
    num_splits, blocks_per_split = _split_blocks(_walk_blocks(a_ids.shape[1], b_len), num_splits)
    split = num_splits > 1
    part_out, part_lse = _split_partials(q, num_splits) if split else (out, lse)  # placeholders unsplit
    sink = _sink_arg(attn_sink, lse)
    for c_q, c_a_ids, c_b_ids, c_out, c_lse, c_part_out, c_part_lse in _attn_launch_views(
            q, a_ids, b_ids, out, lse, part_out, part_lse):
        sparse_mla_fwd_gluon_kernel[(c_q.shape[0], h // MAX_ATTN_BLOCK_H, num_splits)](
            c_q, q.stride(0), q.stride(1),
            a_rows, c_a_ids, a_ids.stride(0), a_ids.shape[1], a_rows.shape[0],
            b_rows, c_b_ids, b_ids.stride(0), b_len, b_rows.shape[0],
            sink, c_out, out.stride(0), out.stride(1), c_lse, lse.stride(0), c_part_out, c_part_lse,
            max(blocks_per_split, 1), sm_scale * LOG2E.value, trace,
            A_FORMAT=a_format, B_FORMAT=b_format, HAS_B=source_b is not None, HAS_SINK=attn_sink is not None,
            SPLIT=split,
            # num_warps is consumer warpgroup 0's; warpgroup 1 and the producer's warps come on top (the kernel
            # module accounts for the registers)
            num_warps=4, maxnreg=MAXNREG.value,
            enable_fp_fusion=True,
        )
    if split:
        _combine_splits(part_out, part_lse, sink, attn_sink is not None, out, lse)
    return out, lse


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --------------------------------------------------------------------------- indexer
def indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    visible: torch.Tensor,
    key_rows: torch.Tensor,
    candidate_blocks: torch.Tensor | None = None,
    block: int = 8,
    query_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indexer scores against keys read from the packed index-key cache (reference.indexer_scores_ref semantics).

    Args:
        q: bf16 [s_q, H, 128], FP4 fake-quantized with RoPE applied (V4.1: H = 32).
        weights: bf16 [s_q, H], already scaled by 128^-0.5 * H^-0.5.
        index_k_cache: uint8 [num_rows_k, 68] (cache_layout.pack_index_k_fp4 rows).
        visible: int64 [s_q]; query i sees logical keys t < visible[i].
        key_rows: int32 flat rows of index_k_cache in logical key order: [n_keys] shared by all queries (one
            sequence; see `key_range_rows` for a contiguous range), [s_q, n_keys] per query, or with query_starts
            [B, n_keys] per sequence; -1 padded. -1 (or outside the cache) = no key: scored -inf.
        candidate_blocks: None (score every key), or a REINDEX layer's candidate blocks, int32 [s_q, kb]
            (`candidate_blocks_of_scores`: ascending block ids, -1 = none): only their keys are scored.
        block: keys per candidate block (V4.1 8).
        query_starts: None, or int64 [B + 1] on q's device, 0 .. s_q ascending: a ragged batch of B sequences,
            sequence b's queries rows query_starts[b] .. query_starts[b + 1] - 1, scored against its own key list
            key_rows[b]. A query's scores are, bit for bit, those of a call with its sequence alone (the same
            kernel: each sequence gets its own query tiles, and a score's products and sums do not depend on which
            tile holds the query). No host synchronisation; at most 65,535 - B query tiles of 4 (H = 32) queries
            without candidate_blocks.
    Returns:
        fp32 [s_q, n_keys] (values exactly bf16; -inf where not visible); with candidate_blocks fp32
        [s_q, kb * block], column c holding key candidate_blocks[i, c // block] * block + c % block
        (reference.candidate_entries; -inf for a -1 block). Kernel results equal the reference bit for bit except,
        rarely, one bf16 ulp from the order of the 32-head fp32 sum.
    """
    if query_starts is not None:
        _check_sequences(q, key_rows, query_starts)
    if candidate_blocks is not None:
        return _indexer_scores_of_candidates(q, weights, index_k_cache, visible, key_rows, candidate_blocks, block,
                                             query_starts)
    if not _use_kernel(q, weights, index_k_cache, key_rows):
        if query_starts is not None:
            return _ragged_scores_reference(q, weights, index_k_cache, visible, key_rows, query_starts, None, block)
        return reference.indexer_scores_paged_ref(q, weights, index_k_cache, visible, key_rows)
    from mini_flashmla.indexer_kernel import indexer_scores_kernel

    q, weights, key_rows, visible = _indexer_operands(q, weights, index_k_cache, key_rows, visible)
    s_q, n_heads, d = q.shape
    n_keys = key_rows.shape[-1]
    out = torch.empty((s_q, n_keys), dtype=torch.float32, device=q.device)
    if s_q == 0 or n_keys == 0:
        return out
    sms = _num_sms(q.device)
    if key_rows.dim() == 2 and query_starts is None:
        _launch_per_query_scores(q, weights, index_k_cache, visible, key_rows, None, 0, out)
        return out
    block_q = max(1, 128 // n_heads)  # N side = block_q * H = 128 columns
    # 128 keys on one warpgroup (4 warps), no pipelining: with the head sum as an MMA 7.30 -> 5.29 ms at 4,096
    # queries x 65,536 keys (session 32's sweep, `git show 7db45be:benchmarks/exp_indexer_mma_headsum.py`; 64 keys
    # / 4 warps 6.53, 128 / 8 warps 6.32 at 3 stages, 256 / 4 warps 6.08; 2-16 programs per SM and 1-2 stages
    # within 0.3%)
    block_k = 128
    key_tiles = math.ceil(n_keys / block_k)
    if query_starts is None:
        views = _launch_views(_rows_per_launch(q.stride(0), weights.stride(0)), q, weights, visible, out)
        n_seqs, starts, key_stride = 1, visible, 0  # starts: unread when SEQS is 0
    else:  # one launch: a sequence's programs must all see its rows
        if s_q > _rows_per_launch(q.stride(0), weights.stride(0)):
            raise ValueError(f"indexer_scores: {s_q} queries with query_starts pass one launch's 32-bit offsets")
        views = [(q, weights, visible, out)]
        n_seqs, starts, key_stride = key_rows.shape[0], query_starts.contiguous(), key_rows.stride(0)
    for c_q, c_weights, c_visible, c_out in views:
        c_s_q = c_q.shape[0]
        # enough query tiles per program to amortise its key dequantization, yet >= ~4 programs per SM
        query_tiles = math.ceil(c_s_q / block_q)
        queries_per_program = block_q * max(1, min(64, key_tiles * query_tiles // (4 * sms)))
        # a ragged batch: each sequence's last run of tiles may be short, so at most one more program per sequence
        programs = math.ceil(c_s_q / queries_per_program) + (n_seqs if query_starts is not None else 0)
        if programs > _MAX_GRID_Y:
            raise ValueError(f"indexer_scores: {programs} query programs pass CUDA's {_MAX_GRID_Y} on a grid's y axis")
        indexer_scores_kernel[(key_tiles, programs)](
            c_q, q.stride(0), q.stride(1), c_weights, weights.stride(0), index_k_cache, index_k_cache.shape[0],
            key_rows, key_stride, c_visible, c_out, out.stride(0), c_s_q, n_keys, queries_per_program, starts, n_seqs,
            H=n_heads, D=d, BLOCK_Q=block_q, BLOCK_K=block_k, ASM=not _interpreting(),
            SEQS=0 if query_starts is None else _next_pow2(n_seqs), num_warps=4, num_stages=1, enable_fp_fusion=True,
        )
    return out


def _check_sequences(q: torch.Tensor, key_rows: torch.Tensor, query_starts: torch.Tensor) -> None:
    """A ragged batch's operands: key_rows [B, n_keys] and query_starts int64 [B + 1] on q's device (their values
    are the caller's contract: reading them would synchronise)."""
    if key_rows.dim() != 2 or query_starts.shape != (key_rows.shape[0] + 1,):
        raise ValueError(f"query_starts must be [B + 1] for key_rows [B, n_keys], got {tuple(query_starts.shape)} "
                         f"and {tuple(key_rows.shape)}")
    if query_starts.dtype != torch.int64 or query_starts.device != q.device:
        raise ValueError(f"query_starts must be int64 on {q.device}, got {query_starts.dtype} on "
                         f"{query_starts.device}")


def _ragged_scores_reference(q: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor,
                             visible: torch.Tensor, key_rows: torch.Tensor, query_starts: torch.Tensor,
                             candidate_blocks: torch.Tensor | None, block: int) -> torch.Tensor:
    """A ragged batch off the kernels (CPU): the shared-key references, one sequence at a time (the per-query
    reference loops over queries in Python: ~75 ops per query row of a prefill on CPU)."""
    starts = query_starts.tolist()
    n_columns = key_rows.shape[1] if candidate_blocks is None else candidate_blocks.shape[1] * block
    out = torch.full((q.shape[0], n_columns), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(key_rows.shape[0]):
        r = slice(starts[b], starts[b + 1])
        if r.start == r.stop:
            continue
        if candidate_blocks is None:
            out[r] = reference.indexer_scores_paged_ref(q[r], weights[r], index_k_cache, visible[r], key_rows[b])
        else:
            out[r] = reference.indexer_scores_candidates_ref(q[r], weights[r], index_k_cache, visible[r], key_rows[b],
                                                             candidate_blocks[r], block)
    return out


def _indexer_operands(q: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor, key_rows: torch.Tensor,
                      visible: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The indexer kernels' operands, checked: (q, weights) with the heads padded to a power of two and at least 16
    (the head-sum MMA's K; zero weights add exact zeros to the sum), weights, key_rows int32 and visible int64
    contiguous (the kernels read a query's head weights as consecutive values)."""
    s_q, n_heads, d = q.shape
    if d != INDEX_HEAD_DIM or q.dtype != torch.bfloat16 or q.stride(2) != 1:
        raise ValueError(f"q must be bf16 [s_q, H, {INDEX_HEAD_DIM}] with a contiguous last dim, got {tuple(q.shape)}")
    if weights.dtype != torch.bfloat16 or weights.shape != (s_q, n_heads):
        raise ValueError(f"weights must be bf16 [s_q={s_q}, H={n_heads}], got {weights.dtype} {tuple(weights.shape)}")
    _check_rows(index_k_cache, INDEX_K_ROW_BYTES, "index_k_cache")
    if n_heads & (n_heads - 1) or n_heads < 16:
        pad = max(16, _next_pow2(n_heads)) - n_heads
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))
        weights = torch.nn.functional.pad(weights, (0, pad))
    return (_q_for_kernels(q), weights.contiguous(), key_rows.to(torch.int32).contiguous(),
            visible.to(torch.int64).contiguous())


def _launch_per_query_scores(q: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor,
                             visible: torch.Tensor, key_rows: torch.Tensor, blocks: torch.Tensor | None, block: int,
                             out: torch.Tensor, query_starts: torch.Tensor | None = None) -> None:
    """indexer_scores_per_query_kernel over out's [s_q, n_columns]: key_rows int32 [n_keys] (shared),
    [s_q, n_keys], or [B, n_keys] with query_starts (a ragged batch); blocks None (column = key) or int32
    [s_q, n_columns / block] candidate blocks."""
    from mini_flashmla.indexer_kernel import indexer_scores_per_query_kernel

    s_q, n_columns = out.shape
    # each program walks a run of its query's keys; enough runs for ~INDEXER_PER_QUERY_PROGRAMS_PER_SM programs/SM
    key_tiles = math.ceil(n_columns / INDEXER_PER_QUERY_BLOCK_K)
    tiles_per_program = max(1, min(64, key_tiles * s_q // (INDEXER_PER_QUERY_PROGRAMS_PER_SM * _num_sms(q.device))))
    keys_per_program = INDEXER_PER_QUERY_BLOCK_K * tiles_per_program
    blocks_arg = key_rows if blocks is None else blocks  # unread when GROUP is 0
    indexer_scores_per_query_kernel[(s_q, math.ceil(n_columns / keys_per_program))](
        q, q.stride(0), q.stride(1), weights, weights.stride(0), index_k_cache, index_k_cache.shape[0],
        key_rows, key_rows.stride(0) if key_rows.dim() == 2 else 0, blocks_arg, blocks_arg.stride(0), visible,
        out, out.stride(0), n_columns, key_rows.shape[-1], keys_per_program,
        visible if query_starts is None else query_starts.contiguous(), key_rows.shape[0], H=q.shape[1],
        D=q.shape[2], BLOCK_K=INDEXER_PER_QUERY_BLOCK_K, STAGES=INDEXER_PER_QUERY_STAGES, ASM=not _interpreting(),
        GROUP=block, SEQS=0 if query_starts is None else _next_pow2(key_rows.shape[0]),
        num_warps=INDEXER_PER_QUERY_WARPS, enable_fp_fusion=True)


def _indexer_scores_of_candidates(q: torch.Tensor, weights: torch.Tensor, index_k_cache: torch.Tensor,
                                  visible: torch.Tensor, key_rows: torch.Tensor, candidate_blocks: torch.Tensor,
                                  block: int, query_starts: torch.Tensor | None) -> torch.Tensor:
    """indexer_scores with candidate_blocks: the per-query kernel reads each candidate key's row id through
    key_rows, so neither the entries nor their rows are materialised."""
    s_q, kb = candidate_blocks.shape
    if candidate_blocks.shape[0] != q.shape[0] or block < 1:
        raise ValueError(f"candidate_blocks must be [s_q={q.shape[0]}, kb] with block >= 1, got "
                         f"{tuple(candidate_blocks.shape)} and block {block}")
    if not _use_kernel(q, weights, index_k_cache, key_rows, candidate_blocks):
        if query_starts is not None:
            return _ragged_scores_reference(q, weights, index_k_cache, visible, key_rows, query_starts,
                                            candidate_blocks, block)
        return reference.indexer_scores_candidates_ref(q, weights, index_k_cache, visible, key_rows, candidate_blocks,
                                                       block)
    q, weights, key_rows, visible = _indexer_operands(q, weights, index_k_cache, key_rows, visible)
    out = torch.empty((s_q, kb * block), dtype=torch.float32, device=q.device)
    if s_q == 0 or kb == 0:
        return out
    if key_rows.shape[-1] == 0:
        return out.fill_(float("-inf"))
    _launch_per_query_scores(q, weights, index_k_cache, visible, key_rows,
                             candidate_blocks.to(torch.int32).contiguous(), block, out, query_starts)
    return out


def key_range_rows(start_row: int, n_keys: int, device: torch.device | str) -> torch.Tensor:
    """key_rows for keys stored in contiguous rows start_row .. start_row + n_keys - 1 (int32 [n_keys])."""
    return torch.arange(start_row, start_row + n_keys, dtype=torch.int32, device=device)


def _query_chunk(s_q: int, n_keys: int) -> int:
    return max(1, min(s_q, INDEXER_CHUNK_BYTES // max(1, 4 * n_keys)))


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    visible: torch.Tensor,
    key_rows: torch.Tensor,
    topk: int,
    candidate_blocks: torch.Tensor | None = None,
    block: int = 8,
) -> torch.Tensor:
    """Scores (see `indexer_scores`) then the top-k logical key positions per query, scored chunk by chunk of
    queries so at most INDEXER_CHUNK_BYTES of fp32 scores exist at once.

    Args: as `indexer_scores`, plus
        topk: V4.1 512.
        candidate_blocks, block: a REINDEX layer's candidate blocks (int32 [s_q, kb], `candidate_blocks`): only
            their keys are scored and selected; the result equals selecting over every key with the others at -inf.
    Returns:
        int32 [s_q, min(topk, n)] (n = n_keys, or kb * block with candidates): reference.indexer_topk_ref semantics
        (ascending positions, -1 fill for keys that score -inf; the lowest position wins ties). Positions are
        logical key indices (0 .. n_keys-1), not cache rows.
    """
    s_q = q.shape[0]
    n = key_rows.shape[-1] if candidate_blocks is None else candidate_blocks.shape[1] * block
    out = torch.empty((s_q, min(topk, n)), dtype=torch.int32, device=q.device)
    chunk = _query_chunk(s_q, n)
    for c0 in range(0, s_q, chunk):
        c1 = min(s_q, c0 + chunk)
        rows = key_rows[c0:c1] if key_rows.dim() == 2 else key_rows
        blocks = None if candidate_blocks is None else candidate_blocks[c0:c1]
        score = indexer_scores(q[c0:c1], weights[c0:c1], index_k_cache, visible[c0:c1], rows, blocks, block)
        picked = topk_of_scores(score, topk)
        out[c0:c1] = picked if blocks is None else candidate_positions(picked, blocks, block)
    return out


def candidate_blocks(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    visible: torch.Tensor,
    key_rows: torch.Tensor,
    compress_len: int,
    block: int = 8,
    topk_blocks: int = 2048,
) -> torch.Tensor:
    """First level of the two-level selection (candidate source layer), chunked by query like `indexer_topk`.

    Args: as `indexer_scores`, plus compress_len (number of compressed entries of the sequence; the block of entry
        compress_len - 1 is always kept), block (V4.1 8) and topk_blocks (V4.1 2048).
    Returns:
        int32 [s_q, min(topk_blocks, n_blocks)]: `candidate_blocks_of_scores` of the scores.
    """
    s_q, n_keys = q.shape[0], key_rows.shape[-1]
    out = torch.empty((s_q, min(topk_blocks, -(-n_keys // block))), dtype=torch.int32, device=q.device)
    chunk = _query_chunk(s_q, n_keys)
    for c0 in range(0, s_q, chunk):
        c1 = min(s_q, c0 + chunk)
        rows = key_rows[c0:c1] if key_rows.dim() == 2 else key_rows
        score = indexer_scores(q[c0:c1], weights[c0:c1], index_k_cache, visible[c0:c1], rows)
        out[c0:c1] = candidate_blocks_of_scores(score, compress_len, block, topk_blocks)
    return out


def candidate_positions(columns: torch.Tensor, candidate_blocks: torch.Tensor, block: int) -> torch.Tensor:
    """Logical key positions of columns of candidate scores (`indexer_scores` with candidate_blocks): int32, shape
    of columns (int [s_q, n], -1 kept). Ascending columns give ascending positions (the blocks ascend), so a top-k
    over candidate scores maps to the reference's top-k over masked scores, ties included."""
    c = columns.long().clamp_min(0)
    b = candidate_blocks.long().gather(1, c // block)
    return torch.where(columns >= 0, b * block + c % block, -1).to(torch.int32)


# --------------------------------------------------------------------------- selection over given scores
TOPK_BLOCK = 4096  # items per step of the selection kernel's loops over memory (rows in registers: below)
TOPK_NUM_WARPS = 8
# Decode: with one program per query, batch 32 at 131k context (65,536 keys) ran 215 us per layer in session 15's
# profile of the medium model, on 32 of 132 SMs. topk_of_scores splits each query's keys into chunks (a power of
# two, each of at least TOPK_MIN_CHUNK_KEYS keys) while the grid stays within one program per SM, then selects
# among the chunks' candidates. Session 15 run 3 (bench_topk.py's decode sweep, 65,536 keys, graph replay, us):
# one program per query 144 at 8-128 queries, 253 at 256; best chunked 69 (8 queries, 8-16 chunks), 80 (32, 4-8),
# 105 (64, 4), and slower than one program per query from 128 queries on (165+ / 289+): the second pass and the
# gathers then cost more than the idle SMs did. Since session 34 only rows too long to hold in registers (the
# ratio-1 layers' 131,072 keys) are split, at any batch, into chunks that are (_topk_chunks).
TOPK_MIN_CHUNK_KEYS = 8192
# Rows of at most 2 x TOPK_RESIDENT_MAX_PAIRS single values (the prefill's 65,536 ratio-2 keys, a REINDEX layer's
# candidates, the decode's rows, the chunked route's second pass) are read once into registers, bf16 values two per
# register, and a bf16 row's k-th key is found there (topk_kernel._resident_band) instead of by two histogram
# passes; session 34. 16 warps hold a 65,536-value row in 64 registers per thread (128 per thread in all: one
# program per SM).
TOPK_RESIDENT_MAX_PAIRS = 32768
TOPK_RESIDENT_NUM_WARPS = 16
# A bf16 row held in registers is then selected by appending its candidates (the values at or above the k-th
# largest one, ties included) to a scratch row and sorting their positions (topk_kernel._select_appended), when
# they number at most TOPK_APPEND_SLOTS_PER_K x next_pow2(k). The indexer's rows tie a few values at the k-th one;
# rows with more ties (bench_topk's few-valued rows) take the selection pass over memory. Session 35 runs 2-3
# (4,096 x 65,536, top-512): 1.37-1.48 ms against 2.13-2.22 ms by the selection pass. 0 turns the append off.
TOPK_APPEND_SLOTS_PER_K = 2
# The loop step of a row held in registers (the append pass's, or the selection pass's). Session 35 (runs 2 / 3):
# 1.366 / 1.380 ms at 8,192 values per step, 1.482 / 1.480 at 4,096, 1.527 / 1.436 at 2,048; the decode rows took
# 38-40 us at 4,096 (run 2) and 39-41 at 8,192 (run 3), within the runs' spread.
TOPK_RESIDENT_BLOCK = 8192


def topk_of_scores(score: torch.Tensor, topk: int) -> torch.Tensor:
    """reference.indexer_topk_ref(score, topk), bit for bit: int32 [s_q, min(topk, n_keys)] ascending positions of
    the top-k (the lowest position wins ties), -1 for selected keys that score -inf, then -1 fill.

    score: fp32 [s_q, n_keys], no NaN. On CUDA a radix select (topk_kernel.py), one program per query, with no
    host synchronisation; the engine calls this on scores it also uses for the candidate mask. With too few queries
    to fill the SMs (decode), each query's keys are split into chunks first (_topk_chunks, _chunked_topk).
    """
    s_q, n_keys = score.shape
    k = min(topk, n_keys)
    if not _use_kernel(score) or k == 0 or s_q == 0:
        return reference.indexer_topk_ref(score, topk)
    chunks = _topk_chunks(s_q, n_keys, k, _num_sms(score.device))
    if chunks > 1:
        return _chunked_topk(score, k, chunks)
    out = torch.empty((s_q, k), dtype=torch.int32, device=score.device)
    _launch_select(score, n_keys, k, -1, out, group=1)
    return out


def _topk_chunks(s_q: int, n_keys: int, k: int, sms: int) -> int:
    """Key chunks per query for topk_of_scores: 1 for a row held in registers. A longer row (the ratio-1 layers'
    131,072 keys) is split into the fewest chunks (a power of two) that are, and then doubled further while the
    doubled grid (s_q x chunks) still fits one program per SM and each chunk keeps at least TOPK_MIN_CHUNK_KEYS keys
    and k. Session 34 run 2 (65,536 keys, graph replay): a row held in registers took 60-63 us at 8-128 queries,
    against 57.5 / 72.6 / 101.5 us routed to 8 / 4 / 2 chunks at 8 / 32 / 64 queries (the chunks' first pass ran
    the histogram passes then, and the second pass's short rows pay 18 block-wide sums in registers)."""
    if _resident_pairs(n_keys):
        return 1
    chunks = 1
    while TOPK_RESIDENT_MAX_PAIRS and not _resident_pairs(-(-n_keys // chunks)):
        chunks *= 2
    while s_q * chunks * 2 <= sms and n_keys // (2 * chunks) >= max(TOPK_MIN_CHUNK_KEYS, k):
        chunks *= 2
    return chunks


def _resident_pairs(n_values: int) -> int:
    """The selection kernel's RESIDENT_PAIRS for a row (or chunk) of n_values single values held in registers, two
    per register (a power of two), or 0 when it is longer than 2 x TOPK_RESIDENT_MAX_PAIRS."""
    return _next_pow2(-(-n_values // 2)) if n_values <= 2 * TOPK_RESIDENT_MAX_PAIRS else 0


def _chunked_topk(score: torch.Tensor, k: int, chunks: int) -> torch.Tensor:
    """topk_of_scores in two passes, bit for bit the same. Pass 1: the top k of each of a row's `chunks` key chunks
    (positions in the row, ascending, -1 past the chunk's finite keys). The row's top k (value descending, then
    position ascending: a total order) are among these candidates, and the candidates stand in position order, so
    pass 2, the same selection over the candidates' values, picks the same keys and breaks ties the same way."""
    s_q, n_keys = score.shape
    chunk_len = -(-n_keys // chunks)
    candidates = torch.empty((s_q, chunks * k), dtype=torch.int32, device=score.device)
    _launch_select(score, n_keys, k, -1, candidates.view(s_q * chunks, k), group=1, chunks=chunks,
                   chunk_len=chunk_len)
    taken = candidates >= 0
    values = score.gather(1, candidates.clamp(min=0).long()).masked_fill_(~taken, float("-inf"))
    picked = torch.empty((s_q, k), dtype=torch.int32, device=score.device)
    _launch_select(values, chunks * k, k, -1, picked, group=1)
    return torch.where(picked >= 0, candidates.gather(1, picked.clamp(min=0).long()), -1)  # int32


def candidate_blocks_of_scores(score: torch.Tensor, compress_len: int, block: int, topk_blocks: int
                               ) -> torch.Tensor:
    """reference.candidate_blocks_ref(score, compress_len, block, topk_blocks), bit for bit: int32
    [s_q, min(topk_blocks, n_blocks)], ascending ids of the top `topk_blocks` blocks of `block` entries (block value
    = max, the block of entry compress_len - 1 forced to +inf, the lowest block wins ties) whose value is not -inf,
    then -1. The REINDEX layers score only these blocks' entries (`indexer_scores(..., candidate_blocks=)`).

    On CUDA the selection kernel takes the block max itself; no host synchronisation.
    """
    s_q, n_keys = score.shape
    n_blocks = -(-n_keys // block)
    k = min(topk_blocks, n_blocks)
    if not _use_kernel(score) or k == 0 or s_q == 0 or block & (block - 1):
        return reference.candidate_blocks_ref(score, compress_len, block, topk_blocks)
    out = torch.empty((s_q, k), dtype=torch.int32, device=score.device)
    forced = (compress_len - 1) // block if compress_len > 0 else -1
    _launch_select(score, n_blocks, k, forced, out, group=block)
    return out


def _launch_select(score: torch.Tensor, n_items: int, k: int, forced_item: int, out: torch.Tensor, group: int,
                   block: int | None = None, num_warps: int | None = None, chunks: int = 1,
                   chunk_len: int = 0, resident: bool | None = None) -> None:
    """One topk_select_kernel program per row of score (fp32, unit column stride), or per key chunk of a row
    (chunks > 1: out has chunks rows per score row). resident (None: whenever a row or chunk may be held in
    registers: single values, no forced item, at most 2 x TOPK_RESIDENT_MAX_PAIRS), block and num_warps (None:
    TOPK_RESIDENT_BLOCK and TOPK_RESIDENT_NUM_WARPS, or TOPK_BLOCK and TOPK_NUM_WARPS) are arguments so the
    benchmark can compare them."""
    from mini_flashmla.topk_kernel import topk_select_kernel

    row_len = chunk_len if chunks > 1 else n_items
    pairs = _resident_pairs(row_len) if group == 1 and forced_item < 0 else 0
    if resident and not pairs:
        raise ValueError("resident=True needs single values, no forced item and at most "
                         f"{2 * TOPK_RESIDENT_MAX_PAIRS} items per row or chunk, got group={group}, "
                         f"forced_item={forced_item}, {row_len} items")
    resident = pairs > 0 if resident is None else resident
    if block is None:
        block = TOPK_RESIDENT_BLOCK if resident else TOPK_BLOCK
    if num_warps is None:
        num_warps = TOPK_RESIDENT_NUM_WARPS if resident else TOPK_NUM_WARPS

    if score.dtype != torch.float32:
        raise ValueError(f"score must be fp32, got {score.dtype}")
    if score.stride(1) != 1:
        score = score.contiguous()
    block = max(16, min(block // group, _next_pow2(n_items)))  # a GROUP > 1 step loads block * group values
    programs = score.shape[0] * chunks
    slots = TOPK_APPEND_SLOTS_PER_K * _next_pow2(k) if resident else 0
    # the append pass's scratch rows; without it the kernel never touches the pointer, so out stands in
    scratch = torch.empty((programs, slots + 1), dtype=torch.int32, device=score.device) if slots else out
    topk_select_kernel[(programs,)](
        score, score.stride(0), score.shape[1], n_items, k, forced_item, out, out.stride(0), chunk_len, scratch,
        GROUP=group, BLOCK=block, CHUNKS=chunks, RESIDENT_PAIRS=pairs if resident else 0, SCRATCH=slots,
        THREADS=32 * num_warps, ASM=not _interpreting(), num_warps=num_warps,
        enable_fp_fusion=True,
    )
