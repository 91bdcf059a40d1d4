"""Fused Triton kernels for the elementwise glue around the routed experts' grouped GEMMs (models/deepseek_v41/moe.py;
the torch chains there are the references and the CPU path).

Why: in the 1-GPU prefill profile (4,096 tokens, top-6 of 384 experts) the glue cost ~50 ms per step against 83 ms of
grouped GEMM. The fixed-size contiguous layout reserves 127 padding rows per expert, so of its ~73k rows only ~24.5k
are real, and the torch chain ran over all of them: the SwiGLU (clamp, silu, two products, bf16 cast: ~8 fp32
passes over [M, I]) and its FP8 quantization, the gather of the quantized tokens into the layout, and the combine
(6 row gathers, each cast to fp32 and added, then the shared expert and a bf16 cast). Decode's masked layout
(E x T rows) is almost all padding.

How, one pass each:
- `swiglu_weight_quant`: h13 [M, 2I] (gate | up) -> h = bf16(w * silu(min(gate, lim)) * clamp(up, -lim, lim)) ->
  FP8 e4m3 + UE8M0 scales per 32 columns. A program covers BLOCK_M rows x GROUPS_PER_PROGRAM quantization groups
  of the listed real rows (plan.pair_row, any layout), or of every layout row with padding (grouped_layout -1)
  masked out of every load and store (the EP path, which has no list), or of every row unweighted (the shared
  expert, moe.shared_expert). A first version covered the masked layout that way too: 0.27 ms at decode for 384
  real rows of 24,576, against 0.01 ms from the list (docs/reports/runtime-moe-glue.md).
- `quant_scatter`: quantizes each token row once and writes it to its k rows of the layout (plan.pair_row): reads
  T rows, writes T*k, never touches a padding row (the torch chain quantizes, then gathers all M rows).
- `combine`: y[t] = bf16(sum_j out[pair_row[t, j]] + shared[t]), in fp32, in one pass.
- `contiguous_plan` (session 31) and `masked_plan` (session 41): where each (token, expert) pair goes in the
  expert-sorted layout, as a stable counting sort in four launches (count per block, block prefix, placement),
  instead of the torch chains' ~35 and ~45 ops (a decode step at 64 tokens: 4.9 -> 0.6 ms per 40 layers;
  docs/reports/runtime-decode.md).

With fold_128 the two quantizing kernels also fold each row's scales per 128 columns (mini-deepgemm's
`fold_groups_to_128`, as `per_token_group_quant_fp8(..., fold_128=True)`): fp32 [rows, width/128] powers of two,
the form the FP8-MMA expert GEMMs run fastest on (docs/reports/deepgemm-moe-fold-128.md).

Padding rows of the FP8 outputs are left unwritten (unspecified bytes, possibly NaN codes). Every consumer ignores
them: the grouped GEMMs compute a row from that row alone (per-row activation scales), so a padding row's garbage
stays in its own output row, and the combines (`combine` here, mini-deepep's Buffer.combine) read only real rows.
The torch chain already fed the w2 GEMM padding rows computed from unspecified h13 rows.

Numerics: the same fp32 operations in the same order as the torch chain, so the outputs are bit-identical on CUDA:
silu as x / (1 + exp(-x)) with libdevice's expf (the CUDA math library's expf, which torch's silu kernel calls) and
an IEEE division (div_rn; Triton's `/` is approximate), separate products (no FMA contraction: no adds follow),
round-to-nearest-even casts; the quantizer is mini-deepgemm's own (`quantize_groups`, shared with
per_token_group_quant_fp8); the combine adds in the torch loop's order (0 + out_0 + ... + out_{k-1} + shared).
tests/test_moe_kernels.py compares bytes. Under TRITON_INTERPRET=1 (CPU) the interpreter's fp32 -> bf16 cast
truncates and its fp32 -> e4m3 cast mis-rounds some values, so there only the structure and loose bounds are checked.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
    from mini_deepgemm.quant_kernel import fold_groups_to_128, quantize_groups
    from triton.language.extra.cuda import libdevice
except ImportError:  # CPU-only installs: the torch chains in moe.py run instead
    triton = None

QUANT_GROUP = 32  # UE8M0 scale granularity of V4.1's activations (moe.QUANT_BLOCK)
FOLD = 128  # columns per folded scale (fold_128)
SWIGLU_BLOCK_M = 8
SWIGLU_GROUPS_PER_PROGRAM = 8
SCATTER_GROUPS_PER_PROGRAM = 32
COMBINE_BLOCK_T = 4
COMBINE_BLOCK_D = 512

if triton is not None:

    @triton.jit
    def swiglu_weight_quant_kernel(h13_ptr, w_ptr, valid_ptr, q_ptr, s_ptr, M, I, limit, LISTED: tl.constexpr,
                                   DENSE: tl.constexpr, WEIGHTED: tl.constexpr, GROUP: tl.constexpr,
                                   BLOCK_M: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr,
                                   LIBDEVICE_EXP: tl.constexpr, FOLD_128: tl.constexpr):
        # the tile's rows are (row, group) pairs: BLOCK_M rows x GROUPS_PER_PROGRAM groups of GROUP columns
        pair = tl.arange(0, BLOCK_M * GROUPS_PER_PROGRAM)
        slot = (tl.program_id(0) * BLOCK_M + pair // GROUPS_PER_PROGRAM).to(tl.int64)  # row * 2I passes 2^31
        grp = tl.program_id(1) * GROUPS_PER_PROGRAM + pair % GROUPS_PER_PROGRAM
        num_groups = I // GROUP
        in_range = slot < M
        if LISTED:  # slot = an entry of the list of real rows (M entries): no padding programs
            row = tl.load(valid_ptr + slot, mask=in_range, other=0)
            valid = in_range
        elif DENSE:  # every row is real (the shared expert)
            row = slot
            valid = in_range
        else:  # slot = a row of the layout (M rows); grouped_layout: -1 marks padding
            row = slot
            valid = tl.load(valid_ptr + row, mask=in_range, other=-1) >= 0
        live = valid & (grp < num_groups)
        col = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        gate = tl.load(h13_ptr + row[:, None] * (2 * I) + col, mask=live[:, None], other=0.0).to(tl.float32)
        up = tl.load(h13_ptr + row[:, None] * (2 * I) + I + col, mask=live[:, None], other=0.0).to(tl.float32)
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        if LIBDEVICE_EXP:  # expf, as torch's silu kernel; tl.exp is a faster approximation (ex2.approx)
            e_neg = libdevice.exp(-gate)
        else:  # the interpreter cannot call libdevice
            e_neg = tl.exp(-gate)
        silu = tl.math.div_rn(gate, 1.0 + e_neg)  # torch's silu: x / (1 + exp(-x)), IEEE division
        h = silu * up
        if WEIGHTED:
            h = tl.load(w_ptr + row, mask=live, other=0.0)[:, None] * h
        h = h.to(tl.bfloat16).to(tl.float32)  # the chain's bf16 h, then its quant
        q, s = quantize_groups(h, True)
        if FOLD_128:
            q, s = fold_groups_to_128(q, s, BLOCK_M * GROUPS_PER_PROGRAM)
            _store_folded_scales(s, s_ptr, row, grp, live, num_groups, BLOCK_M * GROUPS_PER_PROGRAM)
        else:
            tl.store(s_ptr + row * num_groups + grp, s, mask=live)
        tl.store(q_ptr + row[:, None] * I + col, q, mask=live[:, None])

    @triton.jit
    def _store_folded_scales(s, s_ptr, row, grp, live, num_groups, PAIRS: tl.constexpr):
        """Folded scales s [PAIRS / 4] of (row, group) pairs whose every 4 in a row share a row and a 128-column
        block (aligned runs of 4 groups) into s_ptr fp32 [rows, num_groups / 4]."""
        row = tl.max(tl.reshape(row, [PAIRS // 4, 4]), axis=1)
        fold = tl.min(tl.reshape(grp, [PAIRS // 4, 4]), axis=1) // 4
        live = tl.max(tl.reshape(live.to(tl.int32), [PAIRS // 4, 4]), axis=1) > 0
        tl.store(s_ptr + row * (num_groups // 4) + fold, s, mask=live)

    @triton.jit
    def quant_scatter_kernel(x_ptr, rows_ptr, q_ptr, s_ptr, D, K: tl.constexpr, GROUP: tl.constexpr,
                             GROUPS_PER_PROGRAM: tl.constexpr, FOLD_128: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        grp = tl.program_id(1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
        num_groups = D // GROUP
        gm = grp < num_groups
        col = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        x = tl.load(x_ptr + t * D + col, mask=gm[:, None], other=0.0).to(tl.float32)
        q, s = quantize_groups(x, True)
        if FOLD_128:  # one scale per 4 groups
            q, s = fold_groups_to_128(q, s, GROUPS_PER_PROGRAM)
            scale_col = tl.program_id(1) * (GROUPS_PER_PROGRAM // 4) + tl.arange(0, GROUPS_PER_PROGRAM // 4)
            scales_per_row = num_groups // 4
        else:
            scale_col, scales_per_row = grp, num_groups
        for j in tl.static_range(K):  # the token's k rows in the layout
            r = tl.load(rows_ptr + t * K + j)
            tl.store(q_ptr + r * D + col, q, mask=gm[:, None])
            tl.store(s_ptr + r * scales_per_row + scale_col, s, mask=scale_col < scales_per_row)

    @triton.jit
    def combine_kernel(out_ptr, rows_ptr, shared_ptr, y_ptr, T, D, K: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_D: tl.constexpr):
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        tm = t < T
        m = tm[:, None] & (d < D)[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)  # the torch loop's zeros: 0 + out_0 + ... (same bits)
        for j in tl.static_range(K):  # ascending expert id, as the slots of pair_row are sorted
            r = tl.load(rows_ptr + t * K + j, mask=tm, other=0)
            acc += tl.load(out_ptr + r[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        acc += tl.load(shared_ptr + t[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + t[:, None] * D + d[None, :], acc.to(tl.bfloat16), mask=m)


    @triton.jit
    def plan_fill_kernel(grouped_layout_ptr, row_token_ptr, row_weight_ptr, counts_ptr, M, num_counts,
                         BLOCK: tl.constexpr, LAYOUT: tl.constexpr):
        """Every layout row padding (-1 with LAYOUT (the contiguous plan; the masked one has no grouped_layout),
        token 0, weight 0) and the per-block expert counts zero: the state the count and place kernels start
        from."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < M
        if LAYOUT:
            tl.store(grouped_layout_ptr + i, tl.full([BLOCK], -1, tl.int32), mask=m)
        tl.store(row_token_ptr + i, tl.zeros([BLOCK], tl.int64), mask=m)
        tl.store(row_weight_ptr + i, tl.zeros([BLOCK], tl.float32), mask=m)
        tl.store(counts_ptr + i, tl.zeros([BLOCK], tl.int32), mask=i < num_counts)

    @triton.jit
    def plan_count_kernel(idx_ptr, counts_ptr, num_pairs, E, PAIRS: tl.constexpr):
        """counts[b, e] = pairs of block b (PAIRS consecutive (token, slot) pairs in row-major order) routed to e."""
        b = tl.program_id(0)
        p = b * PAIRS + tl.arange(0, PAIRS)
        m = p < num_pairs
        e = tl.load(idx_ptr + p, mask=m, other=0)
        tl.atomic_add(counts_ptr + b * E + e, tl.full([PAIRS], 1, tl.int32), mask=m, sem="relaxed")

    @triton.jit
    def plan_offsets_kernel(counts_ptr, seg_start_ptr, masked_m_ptr, num_blocks, E, align, BLOCK_E: tl.constexpr,
                            BLOCKS_PER_STEP: tl.constexpr, MASKED: tl.constexpr):
        """One program: counts[b, e] becomes the exclusive prefix over blocks (pairs of e in blocks before b), and
        seg_start[e] the first row of e's segment: segments in expert order, each padded to a multiple of align,
        or with MASKED align rows reserved per expert (seg_start = e x align) and masked_m[e] its pair count."""
        e = tl.arange(0, BLOCK_E)
        em = e < E
        total = tl.zeros([BLOCK_E], tl.int32)
        for b0 in range(0, num_blocks, BLOCKS_PER_STEP):
            b = b0 + tl.arange(0, BLOCKS_PER_STEP)
            ptr = counts_ptr + b[:, None] * E + e[None, :]
            m = (b < num_blocks)[:, None] & em[None, :]
            c = tl.load(ptr, mask=m, other=0)
            tl.store(ptr, tl.cumsum(c, axis=0) - c + total[None, :], mask=m)
            total += tl.sum(c, axis=0)
        if MASKED:
            tl.store(seg_start_ptr + e, e * align, mask=em)
            tl.store(masked_m_ptr + e, total, mask=em)
        else:
            aligned = (total + align - 1) // align * align
            tl.store(seg_start_ptr + e, tl.cumsum(aligned, axis=0) - aligned, mask=em)

    @triton.jit
    def plan_place_kernel(idx_ptr, wt_ptr, counts_ptr, seg_start_ptr, grouped_layout_ptr, row_token_ptr,
                          row_weight_ptr, pair_row_ptr, num_pairs, E, K: tl.constexpr, K_PAD: tl.constexpr,
                          PAIRS: tl.constexpr, CHUNK: tl.constexpr, LAYOUT: tl.constexpr):
        """Each pair's row: its expert's segment start + the pairs of that expert in earlier blocks + those before
        it in its own block (a stable counting sort: tokens ascend inside an expert). Writes the row's expert (with
        LAYOUT), token and weight, and pair_row[t, r] with r the pair's rank among its token's slots by expert id."""
        b = tl.program_id(0)
        p = b * PAIRS + tl.arange(0, PAIRS)
        m = p < num_pairs
        e = tl.load(idx_ptr + p, mask=m, other=-1)
        rank = tl.zeros([PAIRS], tl.int32)
        for c0 in tl.static_range(0, PAIRS, CHUNK):  # same-expert pairs before p in the block, CHUNK at a time
            q = b * PAIRS + c0 + tl.arange(0, CHUNK)
            eq = tl.load(idx_ptr + q, mask=q < num_pairs, other=-2)
            before = (eq[None, :] == e[:, None]) & (q[None, :] < p[:, None])
            rank += tl.sum(before.to(tl.int32), axis=1)
        e_safe = tl.where(m, e, 0)
        row = tl.load(seg_start_ptr + e_safe) + tl.load(counts_ptr + b * E + e_safe) + rank
        t = p // K
        if LAYOUT:
            tl.store(grouped_layout_ptr + row, e.to(tl.int32), mask=m)
        tl.store(row_token_ptr + row, t.to(tl.int64), mask=m)
        tl.store(row_weight_ptr + row, tl.load(wt_ptr + p, mask=m, other=0.0), mask=m)
        j = tl.arange(0, K_PAD)
        others = tl.load(idx_ptr + t[:, None] * K + j[None, :], mask=m[:, None] & (j < K)[None, :], other=E)
        slot = tl.sum((others < e[:, None]).to(tl.int32), axis=1)  # the token's experts are distinct
        tl.store(pair_row_ptr + t * K + slot, row.to(tl.int64), mask=m)


def available(t: torch.Tensor) -> bool:
    """Whether the fused kernels apply to tensors like t: Triton importable and t on CUDA (else the torch chains)."""
    return triton is not None and t.is_cuda


def _fp8_rows(num_rows: int, width: int, device: torch.device, fold_128: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (e4m3 [num_rows, width], UE8M0 bytes [num_rows, width / 32] or with fold_128 fp32
    [num_rows, width / 128]): only real rows get written."""
    if width % (FOLD if fold_128 else QUANT_GROUP):
        raise ValueError(f"width {width} is not a multiple of {FOLD if fold_128 else QUANT_GROUP}"
                         + (" (fold_128)" if fold_128 else ""))
    q = torch.empty(num_rows, width, dtype=torch.float8_e4m3fn, device=device)
    if fold_128:
        return q, torch.empty(num_rows, width // FOLD, dtype=torch.float32, device=device)
    return q, torch.empty(num_rows, width // QUANT_GROUP, dtype=torch.uint8, device=device)


def _scales_out(s: torch.Tensor) -> torch.Tensor:
    """_fp8_rows' scales as the quantizers return them: UE8M0 bytes as float8_e8m0fnu, folded ones as they are."""
    return s if s.dtype == torch.float32 else s.view(torch.float8_e8m0fnu)


def swiglu_weight_quant(h13: torch.Tensor, row_weight: torch.Tensor | None, limit: float,
                        grouped_layout: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                        block_m: int = SWIGLU_BLOCK_M, groups_per_program: int = SWIGLU_GROUPS_PER_PROGRAM,
                        fold_128: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """moe.swiglu_weight_quant_torch in one pass over the real rows. h13 bf16 [M, 2I] (gate | up), row_weight fp32
    [M] or None (unweighted: the shared expert, ops.swiglu_expert without row_weight); the real rows given by at
    most one of rows int64 [n] (their indices in any order, e.g. ExpertRows.pair_row: the grid covers only them,
    whatever the layout) or grouped_layout int32 [M] (-1 padding; the grid covers every row, for callers with no
    list, such as the EP path); neither: every row is real. Returns (e4m3 [M, I], UE8M0 scales float8_e8m0fnu
    [M, I/32], or with fold_128 fp32 [M, I/128]); padding rows are unspecified. block_m, groups_per_program: the
    tile (benchmarks sweep them; powers of two, groups_per_program >= 4)."""
    if grouped_layout is not None and rows is not None:
        raise ValueError("give at most one of grouped_layout (contiguous layout) and rows (the real rows)")
    M, inter = h13.shape[0], h13.shape[1] // 2
    if h13.shape[1] != 2 * inter:
        raise ValueError(f"h13 must be [M, 2I], got {tuple(h13.shape)}")
    if fold_128 and groups_per_program % 4:
        raise ValueError(f"fold_128 folds groups four at a time: groups_per_program {groups_per_program} must be a "
                         "multiple of 4")
    q, s = _fp8_rows(M, inter, h13.device, fold_128)
    listed, dense = rows is not None, rows is None and grouped_layout is None
    valid = h13 if dense else (rows if listed else grouped_layout).reshape(-1).contiguous()  # dense: unread
    slots = valid.numel() if listed else M
    if slots:
        weights = h13 if row_weight is None else row_weight.float().contiguous()  # w_ptr unread when unweighted
        grid = (triton.cdiv(slots, block_m), triton.cdiv(inter // QUANT_GROUP, groups_per_program))
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        swiglu_weight_quant_kernel[grid](
            h13.contiguous(), weights, valid, q, s, slots, inter, float(limit), LISTED=listed, DENSE=dense,
            WEIGHTED=row_weight is not None, GROUP=QUANT_GROUP, BLOCK_M=block_m,
            GROUPS_PER_PROGRAM=groups_per_program, LIBDEVICE_EXP=h13.is_cuda, FOLD_128=fold_128,
            enable_fp_fusion=True)
    return q, _scales_out(s)


PLAN_PAIRS = 256  # (token, slot) pairs per block of the plans' count and place kernels
PLAN_CHUNK = 32  # pairs compared at once when ranking a block's pairs


def contiguous_plan(idx: torch.Tensor, wt: torch.Tensor, num_groups: int, align: int, num_rows: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe._plan's contiguous layout in four launches (the torch chain makes ~35): idx int64 [T, k] expert ids
    (distinct per token, in [0, num_groups)), wt fp32 [T, k]; segments in expert order, each starting at a
    multiple of align, tokens ascending inside one; num_rows >= moe.max_rows(T * k, num_groups, align). Returns
    (grouped_layout int32 [num_rows] (-1 padding), row_token int64 [num_rows] (0 padding), row_weight fp32
    [num_rows] (0 padding), pair_row int64 [T, k] (each token's rows by ascending expert id)), equal to the torch
    chain's."""
    grouped_layout = torch.empty(num_rows, dtype=torch.int32, device=idx.device)
    return (grouped_layout, *_launch_plan(idx, wt, num_groups, align, num_rows, grouped_layout, None))


def masked_plan(idx: torch.Tensor, wt: torch.Tensor, num_groups: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe._plan's masked layout in four launches (the torch chain makes ~45 ops, among them a radix sort of ~27 us
    at 64 decode tokens on H200; docs/reports/runtime-decode.md, session 41): idx, wt as contiguous_plan; T rows
    reserved per expert, the rank-th token (ascending) routed to expert e at row e x T + rank. Returns (row_token
    int64 [num_groups x T] (0 padding), row_weight fp32 [num_groups x T] (0 padding), pair_row int64 [T, k],
    masked_m int32 [num_groups] (tokens per expert)), equal to the torch chain's."""
    T = idx.shape[0]
    masked_m = torch.empty(num_groups, dtype=torch.int32, device=idx.device)
    return (*_launch_plan(idx, wt, num_groups, T, num_groups * T, None, masked_m), masked_m)


def _launch_plan(idx, wt, num_groups, align, num_rows, grouped_layout, masked_m):
    """The plans' four kernels: contiguous (grouped_layout given) or masked (masked_m given; align = rows per
    expert). Returns (row_token, row_weight, pair_row)."""
    T, k = idx.shape
    dev = idx.device
    num_pairs, num_blocks = T * k, triton.cdiv(T * k, PLAN_PAIRS)
    layout = grouped_layout is not None
    row_token = torch.empty(num_rows, dtype=torch.int64, device=dev)
    row_weight = torch.empty(num_rows, dtype=torch.float32, device=dev)
    pair_row = torch.empty(T, k, dtype=torch.int64, device=dev)
    counts = torch.empty(num_blocks, num_groups, dtype=torch.int32, device=dev)  # per block, then its prefix
    seg_start = torch.empty(num_groups, dtype=torch.int32, device=dev)
    if num_pairs == 0:
        if layout:
            grouped_layout.fill_(-1)
        else:
            masked_m.zero_()
        row_token.zero_()
        row_weight.zero_()
        return row_token, row_weight, pair_row
    fill = 1024
    plan_fill_kernel[(triton.cdiv(max(num_rows, counts.numel()), fill),)](
        grouped_layout if layout else row_token, row_token, row_weight, counts, num_rows, counts.numel(), BLOCK=fill,
        LAYOUT=layout, enable_fp_fusion=True)
    idx, wt = idx.contiguous(), wt.float().contiguous()
    plan_count_kernel[(num_blocks,)](idx, counts, num_pairs, num_groups, PAIRS=PLAN_PAIRS, enable_fp_fusion=True)
    plan_offsets_kernel[(1,)](counts, seg_start, seg_start if layout else masked_m, num_blocks, num_groups, align,
                              BLOCK_E=triton.next_power_of_2(num_groups), BLOCKS_PER_STEP=8, MASKED=not layout,
                              enable_fp_fusion=True)
    plan_place_kernel[(num_blocks,)](
        idx, wt, counts, seg_start, grouped_layout if layout else row_token, row_token, row_weight, pair_row,
        num_pairs, num_groups, K=k, K_PAD=triton.next_power_of_2(k), PAIRS=PLAN_PAIRS, CHUNK=PLAN_CHUNK,
        LAYOUT=layout, enable_fp_fusion=True)
    return row_token, row_weight, pair_row


def quant_scatter(x: torch.Tensor, pair_row: torch.Tensor, num_rows: int, fold_128: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """moe.quant_gather_torch without padding rows: x bf16 [T, D] quantized per row (FP8 e4m3, UE8M0 per 32) and
    each token's row written to its k rows pair_row int64 [T, k] of a [num_rows, D] layout. Returns (e4m3
    [num_rows, D], float8_e8m0fnu [num_rows, D/32], or with fold_128 fp32 [num_rows, D/128]); rows no pair maps to
    are unspecified."""
    T, D = x.shape
    q, s = _fp8_rows(num_rows, D, x.device, fold_128)
    if T:
        grid = (T, triton.cdiv(D // QUANT_GROUP, SCATTER_GROUPS_PER_PROGRAM))
        quant_scatter_kernel[grid](x.contiguous(), pair_row.contiguous(), q, s, D, K=pair_row.shape[1],
                                   GROUP=QUANT_GROUP, GROUPS_PER_PROGRAM=SCATTER_GROUPS_PER_PROGRAM, FOLD_128=fold_128,
                                   enable_fp_fusion=True)
    return q, _scales_out(s)


def combine(out: torch.Tensor, pair_row: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """moe.combine_torch: bf16 [T, D] = bf16(sum_j out[pair_row[:, j]] + shared) in fp32, j ascending (bit-identical).
    out bf16 [M, D] expert outputs, pair_row int64 [T, k], shared bf16 [T, D]."""
    T, D = shared.shape
    y = torch.empty(T, D, dtype=torch.bfloat16, device=shared.device)
    if T:
        grid = (triton.cdiv(T, COMBINE_BLOCK_T), triton.cdiv(D, COMBINE_BLOCK_D))
        combine_kernel[grid](out.contiguous(), pair_row.contiguous(), shared.contiguous(), y, T, D,
                             K=pair_row.shape[1], BLOCK_T=COMBINE_BLOCK_T, BLOCK_D=COMBINE_BLOCK_D,
                             enable_fp_fusion=True)
    return y
