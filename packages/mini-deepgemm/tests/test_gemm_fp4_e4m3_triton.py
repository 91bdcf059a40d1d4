"""The Triton kernel of the FP8-MMA route (gemm_fp4_e4m3_kernel.py, session 73): the route's folded operands on FP8
MMAs where the Gluon kernels do not run (another triton, a GPU other than Hopper, MINI_DEEPGEMM_GLUON=0), taken
unless MINI_DEEPGEMM_TRITON_FP8_MOE=0 (on by default since session 76: _backend.triton_fp8_moe_enabled).

CPU: its inline PTX interpreted (testing.run_inline_ptx) for every e2m1 code at each position of a route-order word
and every offset, against torch's e4m3; the routing rules. On CUDA, and on the CPU under TRITON_INTERPRET=1 (CI runs
this file once that way, in a subprocess): the conversion in a kernel (the PTX on CUDA, the integer ops under the
interpreter) bitwise against torch's e4m3 on random route-order rows, and both layouts through the public API against
the pure-torch reference on random data (DeepGEMM's diff below 1e-5), padding and unused rows untouched, repeated
calls bitwise equal; two tiles besides the shipped ones likewise. Shapes: ragged groups (empty, one row, a segment
ending one row past a tile), groups of 0, 1, 17 and all rows at each masked tile (16, 32, 64 tokens), K of one step
and of several.
"""

import os

import pytest
import torch

from mini_deepgemm import gemm, reference
from mini_deepgemm.testing import (calc_diff, contiguous_layout, foldable_fp4_weights, fp8_activations, random_bf16,
                                   route_word_cases, run_inline_ptx, run_interpreted)

pytest.importorskip("triton")
import triton  # noqa: E402  (after the importorskip)
import triton.language as tl  # noqa: E402

from mini_deepgemm import gemm_fp4_e4m3_kernel as kernel  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def runner(device: str) -> str:
    """conftest's device (cuda: marked gpu), where a kernel can run: CUDA, or the CPU under TRITON_INTERPRET=1."""
    if device == "cpu" and not INTERPRET:
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    return device
def _e4m3_bytes_of(natural: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 bytes in the checkpoint's order [R, 64] (one K step) and offset bytes [R, 4] (d + 5 per 32-block)
    -> the e4m3 bytes [R, 128] of each value x 2^d, in K order, as torch converts them."""
    values = reference.unpack_fp4(natural)
    scale = torch.exp2(offsets.repeat_interleave(32, dim=1).double() - 5)
    return (values.double() * scale).to(torch.float8_e4m3fn).view(torch.uint8)


def test_the_kernels_ptx_is_exact_for_every_code_position_and_offset():
    """_ROUTE_WORD_TO_E4M3_PTX interpreted: for all 16 codes at each of the 8 positions of a route-order word and every
    offset 0..11 (given as four copies of the byte, as the kernel's pack=4 operand holds them), the e4m3 byte of
    e2m1 x 2^(offset - 5), +0 and -0 alike for code 0 and 8 (the Gluon kernels' form of the same body:
    test_gemm_fp4_e4m3.py)."""
    for offset, pos, word, want, zero in route_word_cases():
        first, second = run_inline_ptx(kernel._ROUTE_WORD_TO_E4M3_PTX.value, [word, offset * 0x01010101], 2)
        got = (((second << 32) | first) >> (8 * pos)) & 0xFF
        assert got == want or (zero and got in (0x00, 0x80)), (offset, pos, hex(word), got, want)


@triton.jit
def _convert_kernel(packed_ptr, offsets_ptr, first_ptr, second_ptr, R: tl.constexpr, ASM: tl.constexpr):
    rows = tl.arange(0, R)[:, None] * 64 + tl.arange(0, 64)[None, :]
    first, second = kernel.route_bytes_to_e4m3(tl.load(packed_ptr + rows), tl.load(offsets_ptr + rows), ASM)
    tl.store(first_ptr + rows, first)
    tl.store(second_ptr + rows, second)


def test_the_conversion_in_a_kernel_is_bitwise_torchs_e4m3(runner):
    """route_bytes_to_e4m3 (the PTX on CUDA, the integer ops under the interpreter) on 64 random route-order rows of a
    K step with random offsets: byte j of the first tile is the value at k = 32 (j // 16) + j % 16, of the second at
    k + 16, each torch's e4m3 of e2m1 x 2^(offset - 5)."""
    gen = torch.Generator().manual_seed(0)
    R = 64
    natural = torch.randint(0, 256, (R, 64), dtype=torch.uint8, generator=gen)
    offsets = torch.randint(0, 12, (R, 4), dtype=torch.uint8, generator=gen)
    want = _e4m3_bytes_of(natural, offsets)
    k_first = torch.tensor([32 * (j // 16) + j % 16 for j in range(64)])
    packed = reference.fp4_to_fp8_mma_order(natural).to(runner)
    offset_bytes = offsets.repeat_interleave(16, dim=1).to(runner)  # byte j's 32-block: j // 16
    first, second = torch.empty_like(packed), torch.empty_like(packed)
    _convert_kernel[(1,)](packed, offset_bytes, first, second, R=R, ASM=runner == "cuda")
    zero = (want & 0x7F) == 0  # code 0 and 8: +0 or -0
    for got, k in ((first.cpu(), k_first), (second.cpu(), k_first + 16)):
        assert torch.equal(torch.where(zero[:, k], 0, got), torch.where(zero[:, k], 0, want[:, k]))


@pytest.fixture
def triton_route(monkeypatch):
    """The package's routing with the Gluon kernels off (as under another triton) and the Triton kernel enabled
    (its default, whatever MINI_DEEPGEMM_TRITON_FP8_MOE says), counting the Triton kernel's launches."""
    launches = []
    monkeypatch.setattr(gemm, "_gluon_runs_on", lambda d: False)
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: True)
    launch = gemm._fp4_e4m3_triton_gemm
    monkeypatch.setattr(gemm, "_fp4_e4m3_triton_gemm", lambda *args: launches.append(args[0]) or launch(*args))
    return launches


CONTIGUOUS_CASES = {  # rows per group, N, K
    "ragged": ([150, 0, 1, 129, 77], 256, 384),
    "one-step": ([40, 260], 384, 128),
    "three-column-tiles": ([3, 128], 384, 256),
}


def _contiguous_checked(case: str, seed: int, runner: str):
    """Runs a CONTIGUOUS_CASES case (random activations folded per 128, foldable FP4 weights) through the public API
    into an output filled with 7.0, asserts it against the pure-torch reference (DeepGEMM's diff below 1e-5) with the
    padding rows untouched, and returns (d, call): call(out) makes the same call into out."""
    rows, N, K = CONTIGUOUS_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    layout = contiguous_layout(rows, gemm.get_m_alignment_for_contiguous_layout())
    q, s = fp8_activations(random_bf16(layout.numel(), K, generator=gen), "per_128")
    bq, sb = foldable_fp4_weights(len(rows), N, K, gen)
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    q, s, bq_route, sb, layout = (t.to(runner) for t in (q, s, bq_route, sb, layout))
    folded = gemm.FoldedFP4Scales(*(t.to(runner) for t in folded))

    def call(out: torch.Tensor) -> None:
        gemm.m_grouped_fp8_fp4_gemm_nt_contiguous((q, s), (bq_route, sb), out, layout, folded=folded)

    d = torch.full((layout.numel(), N), 7.0, dtype=torch.bfloat16, device=runner)
    call(d)
    want = reference.m_grouped_gemm_nt_contiguous_ref(q.cpu(), reference.ue8m0_from_fold_128(s.cpu()), bq, sb.cpu(),
                                                      layout.cpu(), 1, 32)
    used = layout.cpu() >= 0
    assert calc_diff(d.cpu()[used].float(), want[used]) < 1e-5
    assert bool((d.cpu()[~used] == 7.0).all()), "padding rows must stay untouched"
    return d, call


@pytest.mark.parametrize("case", list(CONTIGUOUS_CASES))
def test_contiguous_against_the_reference_padding_untouched_and_repeatable(case, runner, triton_route):
    d, call = _contiguous_checked(case, 3, runner)
    assert triton_route == [gemm._CONTIGUOUS]
    again = torch.full_like(d, 7.0)
    call(again)
    assert torch.equal(again.view(torch.int16), d.view(torch.int16)), "repeated calls must give the same bits"


# gemm_fp4_e4m3_kernel's tiles beside the shipped ones (benchmarks/exp_moe_triton_fp8.py times them): a narrower weight
# tile, and a token tile of a whole 128-row segment
OTHER_TILES = {"128x64": dict(BLOCK_N=128, BLOCK_M=64, num_warps=4, num_stages=3),
               "128x128": dict(BLOCK_N=128, BLOCK_M=128, num_warps=8, num_stages=3)}


@pytest.mark.parametrize("tile", list(OTHER_TILES))
def test_other_tiles_against_the_reference(tile, runner, triton_route, monkeypatch):
    """The contiguous ragged case on tiles other than the shipped one: within the reference's tolerance, padding
    untouched."""
    monkeypatch.setattr(gemm, "FP4_E4M3_TRITON_CONTIGUOUS", OTHER_TILES[tile])
    _contiguous_checked("ragged", 5, runner)


@pytest.mark.parametrize("expected_m", [2, 32, 64])  # the 16-, 32- and 64-token tiles
def test_masked_against_the_reference_and_unused_rows_untouched(expected_m, runner, triton_route):
    G, N, K, max_m = 4, 256, 640, 64
    masked = [0, 1, 17, max_m]
    gen = torch.Generator().manual_seed(4)
    q, s = fp8_activations(random_bf16(G * max_m, K, generator=gen).view(G, max_m, K), "per_128")
    bq, sb = foldable_fp4_weights(G, N, K, gen)
    bq_route, folded = gemm.fold_fp4_weights(bq, sb)
    q, s, bq_route, sb = (t.to(runner) for t in (q, s, bq_route, sb))
    folded = gemm.FoldedFP4Scales(*(t.to(runner) for t in folded))
    masked_m = torch.tensor(masked, dtype=torch.int32, device=runner)
    d = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device=runner)
    gemm.m_grouped_fp8_fp4_gemm_nt_masked((q, s), (bq_route, sb), d, masked_m, expected_m, folded=folded)
    assert triton_route == [gemm._MASKED]
    want = reference.m_grouped_gemm_nt_masked_ref(q.cpu(), reference.ue8m0_from_fold_128(s.cpu()), bq, sb.cpu(),
                                                  masked_m.cpu(), 1, 32)
    used = torch.arange(max_m)[None, :] < torch.tensor(masked)[:, None]
    assert calc_diff(d.cpu()[used].float(), want[used]) < 1e-5
    assert bool((d.cpu()[~used] == 7.0).all()), "rows past masked_m must stay untouched"


def test_the_route_takes_folded_activations_on_fp8_mma_gpus_unless_switched_off(monkeypatch):
    """The Triton kernel takes a folded call with activations folded per 128 and a bf16 output, where Triton runs the
    call and the GPU has FP8 MMAs (sm_89+); per-32 activations read the weights back instead (its loop has no per-32
    form). With the switch off (MINI_DEEPGEMM_TRITON_FP8_MOE=0) no call takes it."""
    q = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    per_128, per_32 = (q, torch.ones(4, 2)), (q, torch.zeros(4, 8, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    d = torch.empty(4, 8, dtype=torch.bfloat16)
    monkeypatch.setattr(gemm, "use_triton", lambda t: True)
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: False)
    assert not gemm._fp4_e4m3_triton_takes(per_128, d), "switched off"
    monkeypatch.setattr(gemm, "triton_fp8_moe_enabled", lambda: True)
    assert gemm._fp4_e4m3_triton_takes(per_128, d)  # a CPU tensor here: the interpreter's case
    assert not gemm._fp4_e4m3_triton_takes(per_32, d)
    assert not gemm._fp4_e4m3_triton_takes(per_128, d.float())
    monkeypatch.setattr(gemm, "use_triton", lambda t: False)
    assert not gemm._fp4_e4m3_triton_takes(per_128, d)


def test_the_switch_is_read_from_the_environment(monkeypatch):
    from mini_deepgemm import _backend

    for value, want in ((None, True), ("0", False), ("1", True)):
        if value is None:
            monkeypatch.delenv("MINI_DEEPGEMM_TRITON_FP8_MOE", raising=False)
        else:
            monkeypatch.setenv("MINI_DEEPGEMM_TRITON_FP8_MOE", value)
        _backend.triton_fp8_moe_enabled.cache_clear()
        assert _backend.triton_fp8_moe_enabled() is want
    _backend.triton_fp8_moe_enabled.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available() or INTERPRET, reason="CUDA runs the kernels directly")
def test_the_kernel_runs_under_the_triton_interpreter_on_cpu():
    """CI has no GPU: run this file's kernel tests once under TRITON_INTERPRET=1."""
    run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                     "in_a_kernel or against_the_reference"], timeout=600, expect="9 passed")
