"""The FP8-MMA route of the grouped FP8 x FP4 GEMMs (gemm.fold_fp4_weights, gemm_gluon_fp4_e4m3_kernel;
docs/reports/deepgemm-fp8-moe.md).

CPU: the folded scales (each row's exponents recovered exactly, the span rule), the route's weight order (each word's
values and signs where the kernels read them, inverted bit for bit), the kernels' e2m1 -> e4m3 byte permutes emulated
bit for bit against torch's e4m3 for every code, position and offset, the argument checks, and the reference fallback on
the reordered weights. GPU (H200, triton 3.6): both layouts against the pure-torch reference on random data (DeepGEMM's
diff below 1e-5), padding and unused rows untouched, a token's row bitwise the same in the contiguous and the masked
layout (the weights are the MMA's B operand in one kernel and its A operand in the other), repeated calls bitwise equal;
the contiguous kernel's 256-row tiles bitwise the same as its 128-row tiles (experts ending after one block of a tile,
blocks of spare capacity, sub-tiles of padding, a last tile past M), and their device-built tile table against a plain
one; the masked kernel's programs looping over an expert's token tiles bitwise its program per tile. Shapes: ragged
groups (empty, one row, 1,024 rows, a segment ending one row past a tile), 8-, 16-, 32- and 64-token masked tiles with
groups of 0, 1, 17 and all rows, K of one step and of several. Each GPU case runs with the activations' UE8M0 scales per
32 and folded per 128 (float32 scales, the kernels' SA_PER_128 loop; the reference then multiplies the folded operands
exactly).
"""

import gc
import importlib.util
import types
import weakref

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm._backend import gluon_usable
from mini_deepgemm.testing import (calc_diff, contiguous_layout, foldable_fp4_weights, fp8_activations, random_bf16,
                                   route_word_cases, run_inline_ptx)

needs_gluon = pytest.mark.skipif(not torch.cuda.is_available() or not gluon_usable(),
                                 reason="needs CUDA and triton 3.6")


def test_folded_scales_recover_every_exponent():
    bq, sb = foldable_fp4_weights(3, 256, 640, torch.Generator().manual_seed(0))
    folded = gemm.fold_fp4_weights(bq, sb)[1]
    e = sb.view(torch.uint8).long()
    offsets = folded.offsets.view(torch.uint8).view(3, 256, 20).long()
    assert int(offsets.min()) >= 0 and int(offsets.max()) <= 11
    ref = e.amax(-1) - 6
    assert torch.equal(offsets - 5 + ref[..., None], e), "offset + ref must give back each scale exponent"
    assert torch.equal(folded.column_scales, torch.exp2((ref - 127).double()).float())


def test_a_row_spanning_more_than_11_is_refused():
    sb = torch.full((1, 128, 8), 120, dtype=torch.uint8)
    bq = torch.zeros(1, 128, 128, dtype=torch.uint8)
    sb[0, 5, 3] = 132  # one row spans 12
    assert gemm.fold_fp4_weights(bq, sb.view(torch.float8_e8m0fnu)) is None
    sb[0, 5, 3] = 131
    assert gemm.fold_fp4_weights(bq, sb.view(torch.float8_e8m0fnu)) is not None
    with pytest.raises(ValueError, match="bq must be packed FP4"):
        gemm.fold_fp4_weights(bq[:, :, :64], sb.view(torch.float8_e8m0fnu))


def test_no_fold_on_a_cuda_device_without_the_route_kernels(monkeypatch):
    """A CUDA device where no FP8-MMA route runs keeps the bf16 route: folding there would make every call read the
    weights back. CPU folds (the references read them back), and so does a device where the Gluon kernels run, or,
    unless MINI_DEEPGEMM_TRITON_FP8_MOE=0, one with FP8 MMAs (sm_89+: gemm_fp4_e4m3_kernel)."""
    cuda_tensor = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(gemm, "gluon_runs_on", lambda t: False)
    monkeypatch.setattr(gemm, "_fp8_mma_on", lambda t: True)
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: False)
    assert not gemm._folds_on(cuda_tensor) and gemm._folds_on(torch.zeros(1))
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: True)
    assert gemm._folds_on(cuda_tensor)
    monkeypatch.setattr(gemm, "_fp8_mma_on", lambda t: False)
    assert not gemm._folds_on(cuda_tensor)
    monkeypatch.setattr(gemm, "gluon_runs_on", lambda t: True)
    assert gemm._folds_on(cuda_tensor)


def test_the_route_weight_order(monkeypatch):
    """fold_fp4_weights's weights: in each 64-byte K step, word 4c + q holds values 32c + 4q .. + 3 (low half) and
    32c + 16 + 4q .. + 3 (high half), value i's magnitude in bits 4i .. 4i + 2 and its sign in bit SIGN_BITS[i]; the
    inverse gives the checkpoint's bytes back; the same bytes whatever the chunk of rows per pass, in place too."""
    bq, sb = foldable_fp4_weights(2, 128, 256, torch.Generator().manual_seed(9))
    ordered = gemm.fold_fp4_weights(bq, sb)[0]
    assert ordered.shape == bq.shape and ordered.dtype == bq.dtype
    assert torch.equal(reference.fp4_from_fp8_mma_order(ordered), bq)
    monkeypatch.setattr(reference, "_ORDER_CHUNK_BYTES", 3 * 128)  # 3 of the 256 rows per pass, the last pass 1
    assert torch.equal(reference.fp4_to_fp8_mma_order(bq), ordered)
    assert torch.equal(reference.fp4_from_fp8_mma_order(ordered), bq)
    chunked_in_place = bq.clone()
    assert torch.equal(reference.fp4_to_fp8_mma_order(chunked_in_place, out=chunked_in_place), ordered)
    monkeypatch.undo()
    signed = reference.fp4_to_fp8_mma_order(bq.view(torch.int8))  # int8 checkpoints: the same bytes, their dtype
    assert signed.dtype == torch.int8 and torch.equal(signed.view(torch.uint8), ordered)
    assert torch.equal(reference.fp4_from_fp8_mma_order(signed), bq.view(torch.int8))
    in_place = bq.clone()
    assert gemm.fold_fp4_weights(in_place, sb, out=in_place)[0] is in_place and torch.equal(in_place, ordered)
    with pytest.raises(ValueError, match="out must be contiguous"):
        gemm.fold_fp4_weights(bq, sb, out=torch.empty_like(bq)[:, :64])
    codes = torch.stack([bq & 0xF, bq >> 4], -1).view(2, 128, 2, 4, 2, 4, 4)  # (g, n, step, c, s, q, value)
    words = ordered.view(torch.int32).view(2, 128, 2, 4, 4).long() & 0xFFFFFFFF  # (g, n, step, c, q)
    for i, sign_bit in enumerate((7, 15, 23, 31, 3, 11, 19, 27)):
        code = ((words >> (4 * i)) & 7) | (((words >> sign_bit) & 1) << 3)
        assert torch.equal(code, codes[:, :, :, :, i // 4, :, i % 4].long()), i


def test_the_byte_permute_conversion_is_exact():
    """The Gluon kernels' _E2M1_TO_E4M3_PTX, interpreted (testing.run_inline_ptx), for all 16 codes at each of the 8
    positions of a route-order word and every offset 0..11: the e4m3 bytes of e2m1 x 2^(offset - 5), as torch converts
    them (+0 and -0 alike)."""
    k = pytest.importorskip("mini_deepgemm.gemm_gluon_fp4_e4m3_kernel")
    for offset, pos, word, want, zero in route_word_cases():
        lo = (k.LUT_LO_BASE.value + offset * k.LUT_LO_STEP.value) & 0xFFFFFFFF
        hi = (k.LUT_HI_BASE.value + offset * k.LUT_HI_STEP.value) & 0xFFFFFFFF
        r0, r1 = run_inline_ptx(k._E2M1_TO_E4M3_PTX.value, [word, lo, hi], 2)
        got = ((r1 << 32 | r0) >> (8 * pos)) & 0xFF
        assert got == want or (zero and got in (0x00, 0x80)), (offset, pos, hex(word), got, want)


def _contiguous_case(rows, N, K, gen, device="cpu", activations="per_32"):
    layout = contiguous_layout(rows, gemm.get_m_alignment_for_contiguous_layout())
    q, s = fp8_activations(random_bf16(layout.numel(), K, generator=gen), activations)
    bq, sb = foldable_fp4_weights(len(rows), N, K, gen)
    return q.to(device), s.to(device), bq.to(device), sb.to(device), layout.to(device)


def _per_32(s: torch.Tensor) -> torch.Tensor:
    """The reference's form of either activation scales: folded ones as UE8M0 per 32 (exact)."""
    return reference.ue8m0_from_fold_128(s) if s.dtype == torch.float32 else s


def test_folded_activations_are_their_per_32_form_everywhere_but_the_fp8_mma_route():
    """Activations folded per 128 (float32 scales) multiply as the same values given as UE8M0 per 32 (each scale
    repeated four times): bitwise, on the CPU, in both grouped layouts."""
    gen = torch.Generator().manual_seed(5)
    q, s, bq, sb, layout = _contiguous_case([5, 0, 130], 256, 384, gen, activations="per_128")
    assert s.dtype == torch.float32 and tuple(s.shape) == (layout.numel(), 3)
    assert torch.equal(reference.act_dequant(q, s, 128), reference.act_dequant(q, _per_32(s), 32))
    d, want = (torch.full((layout.numel(), 256), 7.0, dtype=torch.bfloat16) for _ in range(2))
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq_route, sb), d, layout, folded=folded)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, _per_32(s)), (bq, sb), want, layout)
    assert torch.equal(d.view(torch.int16), want.view(torch.int16))
    G, max_m = 3, 40
    qm, sm = fp8_activations(random_bf16(G * max_m, 384, generator=gen).view(G, max_m, 384), "per_128")
    masked_m = torch.tensor([0, 1, 40], dtype=torch.int32)
    d, want = (torch.full((G, max_m, 256), 7.0, dtype=torch.bfloat16) for _ in range(2))
    gemm.m_grouped_fp8_fp4_gemm_nt_masked((qm, sm), (bq, sb), d, masked_m, 16)
    gemm.m_grouped_fp8_fp4_gemm_nt_masked((qm, _per_32(sm)), (bq, sb), want, masked_m, 16)
    assert torch.equal(d.view(torch.int16), want.view(torch.int16))


def test_folded_activation_errors_name_the_problem():
    gen = torch.Generator().manual_seed(6)
    q, s, bq, sb, layout = _contiguous_case([3], 256, 256, gen, activations="per_128")
    d = torch.empty(layout.numel(), 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="folded per 128"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s[:, :1].contiguous()), (bq, sb), d, layout)
    with pytest.raises(ValueError, match="FP4 weights need UE8M0 scales"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb.float()), d, layout)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its Gluon TensorDescriptor)")
def test_the_packed_weight_descriptors_keep_no_weight_alive():
    """The route's weight descriptors (built on the host, no GPU needed) must not outlive their call: a descriptor
    references its tensor, so a cache of them kept a dropped model's expert weights in memory."""
    bq = torch.zeros(2, 128, 256, dtype=torch.int8)  # the runtime's int8 storage of packed FP4
    alive = weakref.ref(bq)
    for steps in (1, 2):
        desc = gemm._packed_fp4_desc(bq, steps)
        assert desc.block_shape == ([128, 64] if steps == 1 else [steps, 128, 64])
    del bq, desc
    gc.collect()
    assert alive() is None, "the packed weights are still referenced after the call"


def test_folded_on_the_cpu_is_the_reference():
    """Where the Gluon kernels do not run, the reordered weights are read back in the checkpoint's order: the
    reference's bits."""
    gen = torch.Generator().manual_seed(1)
    q, s, bq, sb, layout = _contiguous_case([5, 0, 130], 256, 256, gen)
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    d, want = (torch.full((layout.numel(), 256), 7.0, dtype=torch.bfloat16) for _ in range(2))
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq_route, sb), d, layout, folded=folded)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), want, layout)
    assert torch.equal(d.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("expected_m,folded,want", [
    (1, True, (8, True)), (4, True, (8, True)), (5, True, (16, True)), (8, True, (16, True)),
    (9, True, (16, False)), (32, True, (32, False)), (33, True, (64, False)),
    (1, False, (16, True)), (8, False, (16, True)), (16, False, (16, False))])
def test_the_masked_launch_by_expected_rows(expected_m, folded, want):
    """The masked kernel's route (session 44): 8-token tiles only on folded activations up to ~4 rows, one program
    per expert only up to ~8 rows (above, experts take several tiles that should share their weights through L2),
    a register cap only on the folded loop up to 32 tokens, and ring slots of two K steps (session 52) only on the
    folded loop's tiles of at most 16 tokens that are not split."""
    tile = gemm._masked_tile(expected_m, folded)
    assert (tile.tokens, tile.one_program) == want
    assert tile.maxnreg == (96 if tile.tokens == 8 else 128 if folded and tile.tokens <= 32 else None)
    assert tile.split == (folded and 8 < expected_m <= 32)
    assert (tile.k_per_slot, tile.slot_unrolled) == ((2, True) if folded and tile.tokens <= 16 and not tile.split
                                                     else (1, True))


def test_a_split_masked_tile_launches_each_expert_once():
    """A split tile (session 50): experts of at most T rows on T-token tiles, one program each, the rest on 2T-token
    tiles; row-count ranges that cover every count once."""
    big = gemm._INT32_MAX
    assert gemm._masked_launches(gemm.MaskedTile(32, 2, 128, False)) == [(gemm.MaskedTile(32, 2, 128, False), 0, big)]
    assert gemm._masked_launches(gemm.MaskedTile(32, 2, 128, False, split=True)) == [
        (gemm.MaskedTile(32, 2, 128, True), 0, 32), (gemm.MaskedTile(64, 2, None, False), 33, big)]
    assert gemm._masked_launches(gemm._masked_tile(16, True)) == [
        (gemm.MaskedTile(16, 2, 128, True), 0, 16), (gemm.MaskedTile(32, 2, 128, False), 17, big)]


def test_folded_argument_errors_name_the_problem():
    gen = torch.Generator().manual_seed(2)
    q, s, bq, sb, layout = _contiguous_case([3], 256, 256, gen)
    bq, folded = gemm.fold_fp4_weights(bq, sb)
    d = torch.empty(layout.numel(), 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiples of 128"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq[:, :192].contiguous(), sb[:, :192].contiguous()),
                                                  d[:, :192].contiguous(), layout, folded=folded)
    with pytest.raises(ValueError, match="folded.offsets must be int32"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), d, layout,
                                                  folded=gemm.FoldedFP4Scales(folded.offsets[:, :128],
                                                                              folded.column_scales))
    with pytest.raises(ValueError, match="writes bf16"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), d.float(), layout, folded=folded)
    with pytest.raises(ValueError, match="expected_m must be a non-negative int"):
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), d, layout, folded=folded, expected_m=64.0)


CONTIGUOUS_CASES = {  # rows per group, N, K
    "ragged": ([300, 0, 1, 128, 1024, 77, 129], 512, 640),
    "one-step": ([150, 260], 256, 128),
    "n384": ([300, 1, 0, 520], 384, 256),
    # tiles whose second 64-row half is padding (64, 192: exactly 64 real rows; 1) or holds one real row (65)
    "halves": ([64, 65, 192, 1], 256, 256),
}


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("activations", ["per_32", "per_128"])
@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
def test_contiguous_against_the_reference_padding_untouched_and_repeatable(case, activations):
    rows, N, K = CONTIGUOUS_CASES[case]
    gen = torch.Generator().manual_seed(3)
    q, s, bq, sb, layout = _contiguous_case(rows, N, K, gen, "cuda", activations)
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    d = torch.full((layout.numel(), N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq_route, sb), d, layout, folded=folded)
    want = reference.m_grouped_gemm_nt_contiguous_ref(q, _per_32(s), bq, sb, layout, 1, 32)
    used = layout >= 0
    assert calc_diff(d[used].float(), want[used]) < 1e-5
    assert bool((d[~used] == 7.0).all()), "padding rows must stay untouched"
    again = torch.full_like(d, 7.0)
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq_route, sb), again, layout, folded=folded)
    assert torch.equal(again.view(torch.int16), d.view(torch.int16)), "repeated calls must give the same bits"


def test_contiguous_tiles_are_256_rows_for_large_experts_on_folded_activations():
    def block_m(M, groups, per_128=True, expected_m=None):
        return gemm._contiguous_block_m(gemm._contiguous_rows(M, groups, expected_m), per_128)

    # layouts of the 128-aligned segments alone: real rows ~ M / groups - 64
    assert block_m(58880, 96) == 256  # 96 experts of 128-1,024 rows (~613 with padding)
    assert block_m(30720, 96) == 256  # EP4's prefill: ~320 rows per expert with padding
    assert block_m(36864, 192) == 256  # EP2's prefill: ~192 rows per expert with padding
    assert block_m(16384, 96) == 128  # ~171 rows per expert with padding
    assert block_m(49152, 384) == 128  # 1-GPU prefill: ~64 real rows per expert
    assert block_m(58880, 96, per_128=False) == 128  # per-32 activations: 128-row tiles only
    # a fixed capacity (the engine's: every pair plus 127 rows per expert) takes the caller's expected_m
    capacity = 4096 * 6 + 384 * 127  # 4,096 tokens x 6 over 384 experts: 64 real rows each, M / groups ~191
    assert block_m(capacity, 384, expected_m=64) == 128
    capacity = 6144 * 6 + 384 * 127  # 96 real rows each, M / groups ~223
    assert block_m(capacity, 384) == 256
    assert block_m(capacity, 384, expected_m=96) == 128
    assert block_m(8192 * 6 + 384 * 127, 384, expected_m=128) == 256
    assert gemm._contiguous_rows(128 * 96, 384, None) == 1  # most experts without a segment: at least one row


def _tile_table(layout: torch.Tensor) -> list[int]:
    """contiguous_tile_table_kernel's table, written plainly: [count, first row of each 256-row tile], the tiles cut
    from each expert's first 128-row block, none starting at a block of padding."""
    starts, run_start, before = [], 0, None
    for block in range(-(-layout.numel() // 128)):
        g = int(layout[128 * block])
        run_start = block if g != before else run_start
        before = g
        if g >= 0 and (block - run_start) % 2 == 0:
            starts.append(128 * block)
    return [len(starts), *starts]


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("chunk", [4, 1024])
def test_the_256_row_tile_table(chunk):
    """The device-built tile table against _tile_table on random 128-aligned layouts: experts of 0 to 9 blocks, whole
    blocks of spare capacity, a last segment cut short of its padding; chunk 4 carries runs and the count across
    chunks."""
    from mini_deepgemm.gemm_gluon_fp4_e4m3_kernel import contiguous_tile_table_kernel

    gen = torch.Generator().manual_seed(11)
    for trial in range(20):
        experts = int(torch.randint(1, 40, (1,), generator=gen))
        rows = torch.randint(0, 1100, (experts,), generator=gen) * (torch.rand(experts, generator=gen) < 0.8)
        spare = torch.randint(0, 3, (experts,), generator=gen) * (torch.rand(experts, generator=gen) < 0.3)
        layout = contiguous_layout(rows.tolist(), 128, spare.tolist())
        layout = layout[:layout.numel() - trial * 7].cuda()  # the last segment's padding cut short (or into its rows)
        if layout.numel() == 0:
            layout = torch.zeros(1, dtype=torch.int32, device="cuda")
        table = torch.full((1 + -(-layout.numel() // 128),), -7, dtype=torch.int32, device="cuda")
        contiguous_tile_table_kernel[(1,)](layout, table, layout.numel(), CHUNK=chunk, num_warps=4)
        want = _tile_table(layout.cpu())
        assert table[:len(want)].tolist() == want, trial


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
def test_contiguous_256_row_tiles_bitwise_the_128_row_tiles(case, monkeypatch):
    """Every row as the same MMA chain and promotion whatever the tile: 256-row tiles give the 128-row tiles' bits,
    padding rows untouched by both (ragged: experts of an odd number of 128-row blocks, whose last tile's second
    block is the next expert's, and two blocks of spare capacity inserted, which start no tile; halves: second
    sub-tiles of padding; one-step and n384: a last tile past M)."""
    rows, N, K = CONTIGUOUS_CASES[case]
    gen = torch.Generator().manual_seed(5)
    q, s, bq, sb, layout = _contiguous_case(rows, N, K, gen, "cuda", "per_128")
    if case == "ragged":  # an expert's spare capacity: a whole 128-row block of padding before the next expert's
        layout = torch.cat([layout[:384], torch.full((256,), -1, dtype=layout.dtype, device="cuda"), layout[384:]])
        q, s = (torch.cat([t[:384], t[:256], t[384:]]) for t in (q, s))  # (any values in padding rows)
    bq, folded = gemm.fold_fp4_weights(bq, sb)
    out = {}
    for block_m in (128, 256):
        monkeypatch.setattr(gemm, "_contiguous_block_m", lambda *args, b=block_m: b)
        monkeypatch.setattr(gemm, "CONTIGUOUS_SWAPAB_MAX_ROWS", 0)
        out[block_m] = torch.full((layout.numel(), N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), out[block_m], layout, folded=folded)
    assert torch.equal(out[256].view(torch.int16), out[128].view(torch.int16))


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
# the swap-AB kernel's 8-token tile looping over a block's tiles, 16 and 32 split in two launches, 64 per tile
@pytest.mark.parametrize("expected_m", [4, 16, 32, 64])
def test_contiguous_on_the_swapab_kernel_gives_the_contiguous_kernels_bits(case, expected_m, monkeypatch):
    """The contiguous layout on the swap-AB kernel (its 128-row blocks as masked groups, CONTIGUOUS_SWAPAB_MAX_ROWS)
    gives the contiguous kernel's bits, padding rows untouched by both: experts of 0 to 1,024 rows, a whole block of
    spare capacity (all padding: its programs exit), and M cut 9 rows into the last segment's padding (a last
    block past M)."""
    rows, N, K = CONTIGUOUS_CASES[case]
    gen = torch.Generator().manual_seed(6)
    q, s, bq, sb, layout = _contiguous_case(rows, N, K, gen, "cuda", "per_128")
    spare = torch.full((128,), -1, dtype=layout.dtype, device="cuda")
    layout, q, s = torch.cat([spare, layout[:-9]]), torch.cat([q[:128], q[:-9]]), torch.cat([s[:128], s[:-9]])
    bq, folded = gemm.fold_fp4_weights(bq, sb)
    out = {}
    for max_rows in (0, 2**31):
        monkeypatch.setattr(gemm, "CONTIGUOUS_SWAPAB_MAX_ROWS", max_rows)
        out[max_rows] = torch.full((layout.numel(), N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq, sb), out[max_rows], layout, folded=folded,
                                                  expected_m=expected_m)
    assert torch.equal(out[2**31].view(torch.int16), out[0].view(torch.int16))
    assert bool((out[2**31][layout < 0] == 7.0).all()), "padding rows must stay untouched"


def test_contiguous_calls_take_the_swapab_kernel_up_to_its_rows_on_folded_activations():
    top = gemm.CONTIGUOUS_SWAPAB_MAX_ROWS
    assert gemm._contiguous_swapab(top, True) and not gemm._contiguous_swapab(top + 1, True)
    assert not gemm._contiguous_swapab(1, False)  # per-32 activations: the contiguous kernel only


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("activations", ["per_32", "per_128"])
# 8- (folded activations), 16-, 32- and 64-token tiles; 16 and 32 split on folded activations (_masked_launches)
@pytest.mark.parametrize("expected_m", [2, 8, 16, 32, 64])
def test_masked_against_the_reference_and_bitwise_the_contiguous_rows(expected_m, activations):
    G, N, K, max_m = 6, 384, 640, 64
    masked = [0, 1, 17, max_m, 5, 40]
    gen = torch.Generator().manual_seed(4)
    q, s = fp8_activations(random_bf16(G * max_m, K, generator=gen).view(G, max_m, K), activations)
    q, s = q.cuda(), s.cuda()
    bq, sb = foldable_fp4_weights(G, N, K, gen, "cuda")
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    masked_m = torch.tensor(masked, dtype=torch.int32, device="cuda")
    d = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
    gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq_route, sb), d, masked_m, expected_m, folded=folded)
    want = reference.m_grouped_gemm_nt_masked_ref(q, _per_32(s), bq, sb, masked_m, 1, 32)
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    assert calc_diff(d[used].float(), want[used]) < 1e-5
    assert bool((d[~used] == 7.0).all()), "rows past masked_m must stay untouched"

    # the same token rows in the contiguous layout: the same bits
    layout = contiguous_layout(masked, gemm.get_m_alignment_for_contiguous_layout()).cuda()
    starts = [0]
    for m in masked:
        starts.append(starts[-1] + -(-m // 128) * 128)
    where = torch.tensor([starts[g] + i for g, m in enumerate(masked) for i in range(m)], device="cuda")
    q_c = torch.zeros(layout.numel(), K, device="cuda").to(torch.float8_e4m3fn)
    if activations == "per_128":
        s_c = torch.ones(layout.numel(), K // 128, device="cuda")
        q_c[where], s_c[where] = q[used], s[used]
    else:
        s_c = torch.full((layout.numel(), K // 32), 127, dtype=torch.uint8, device="cuda")  # index_put: no e8m0
        q_c[where], s_c[where] = q[used], s.view(torch.uint8)[used]
        s_c = s_c.view(torch.float8_e8m0fnu)
    d_c = torch.empty(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
    gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q_c, s_c), (bq_route, sb), d_c, layout, folded=folded)
    assert torch.equal(d[used].view(torch.int16), d_c[where].view(torch.int16)), "masked vs contiguous rows"


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("K", [768, 1024])
@pytest.mark.parametrize("tokens", [8, 16, 32, 64])
def test_masked_ring_slots_of_two_k_steps_give_the_same_bits(tokens, K, monkeypatch):
    """A ring slot of two K steps (MaskedTile.k_per_slot, 3-D descriptors), unrolled or in a loop, computes each output
    element as one step per slot does: K of 6 steps (3 ring steps on a 2-deep ring: a program's second tile starts on
    the other phase) and 8, per-tile programs and one program per expert, experts of 0, 1, 17, all 64, 5 and 40 rows;
    a K of an odd number of steps falls back to one per slot (the other tests' K of 5 steps)."""
    G, N, max_m = 6, 384, 64
    masked_m = torch.tensor([0, 1, 17, max_m, 5, 40], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(9)
    q, s = fp8_activations(random_bf16(G * max_m, K, generator=gen).view(G, max_m, K), "per_128")
    q, s = q.cuda(), s.cuda()
    bq, sb = foldable_fp4_weights(G, N, K, gen, "cuda")
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    out = {}
    for one_program in (False, True):
        for slot in ((1, True), (2, True), (2, False)):
            tile = gemm.MaskedTile(tokens, 2, gemm._masked_register_cap(tokens, True), one_program, False, *slot)
            monkeypatch.setattr(gemm, "_masked_tile", lambda *args, t=tile: t)
            d = out[one_program, slot] = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
            gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq_route, sb), d, masked_m, 8, folded=folded)
    for key, d in out.items():
        assert torch.equal(d.view(torch.int16), out[False, (1, True)].view(torch.int16)), key
    want = reference.m_grouped_gemm_nt_masked_ref(q, _per_32(s), bq, sb, masked_m, 1, 32)
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    assert calc_diff(out[True, (2, True)][used].float(), want[used]) < 1e-5


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("expected_m", [16, 32])
def test_a_split_masked_call_on_two_streams_gives_the_same_bits(expected_m, monkeypatch):
    """The split's wide launch on a side stream (gemm.MASKED_SPLIT_SIDE_STREAM, session 53) writes the
    same bits as the two launches in series, and the caller's stream sees them without a sync: experts of 0, 1,
    expected_m, expected_m + 1, 2 x expected_m and all 64 rows, K of 8 steps, the default call (no graph)."""
    G, N, K, max_m = 6, 384, 1024, 64
    masked_m = torch.tensor([0, 1, expected_m, expected_m + 1, 2 * expected_m, max_m], dtype=torch.int32,
                            device="cuda")
    gen = torch.Generator().manual_seed(11)
    q, s = fp8_activations(random_bf16(G * max_m, K, generator=gen).view(G, max_m, K), "per_128")
    q, s = q.cuda(), s.cuda()
    bq, sb = foldable_fp4_weights(G, N, K, gen, "cuda")
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    assert gemm._masked_tile(expected_m, True).split
    out = {}
    for side_stream in (False, True):
        monkeypatch.setattr(gemm, "MASKED_SPLIT_SIDE_STREAM", side_stream)
        d = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq_route, sb), d, masked_m, expected_m, folded=folded)
        out[side_stream] = d.clone()  # on the caller's stream: ordered after both launches
    assert torch.equal(out[True].view(torch.int16), out[False].view(torch.int16))


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("activations", ["per_32", "per_128"])
@pytest.mark.parametrize("tokens", [8, 16, 32])
def test_masked_programs_looping_over_token_tiles_give_the_same_bits(tokens, activations, monkeypatch):
    """One program per expert and weight rows walking its token tiles (MaskedTile.one_program) computes each tile as
    the program per tile does, its ring's phases running on from tile to tile: K of 5 steps on a 2-deep ring (an odd
    count, so a second tile starts on the other phase) and experts of 0, 1, 17, all 64, 5 and 40 rows."""
    G, N, K, max_m = 6, 384, 640, 64
    masked_m = torch.tensor([0, 1, 17, max_m, 5, 40], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(6)
    q, s = fp8_activations(random_bf16(G * max_m, K, generator=gen).view(G, max_m, K), activations)
    q, s = q.cuda(), s.cuda()
    bq, sb = foldable_fp4_weights(G, N, K, gen, "cuda")
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    out = {}
    for one_program in (False, True):
        tile = gemm.MaskedTile(tokens, 2, 128 if activations == "per_128" else None, one_program)
        monkeypatch.setattr(gemm, "_masked_tile", lambda *args, t=tile: t)
        out[one_program] = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device="cuda")
        gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq_route, sb), out[one_program], masked_m, 8, folded=folded)
    assert torch.equal(out[True].view(torch.int16), out[False].view(torch.int16))
    want = reference.m_grouped_gemm_nt_masked_ref(q, _per_32(s), bq, sb, masked_m, 1, 32)
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]
    assert calc_diff(out[True][used].float(), want[used]) < 1e-5
