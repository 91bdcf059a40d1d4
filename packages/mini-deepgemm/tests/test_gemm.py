"""GEMMs against the pure-torch references.

Metric: DeepGEMM's calc_diff. Against the reference fed the same quantized operands the only difference is the
order of fp32 additions plus the bf16 output rounding, so the bound is tight (1e-5); against the unquantized
bf16 product the bound is DeepGEMM's (FP8 x FP8: 1e-3, one FP4 operand: 1e-2).
"""

import pytest
import torch

import mini_deepgemm as dg
from mini_deepgemm import reference
from mini_deepgemm.testing import calc_diff, contiguous_layout, random_bf16, random_fp4_weights, random_fp8_weights

SAME_INPUTS_TOL = 1e-5


def quant_a(x, gran_k):
    return reference.act_quant(x, gran_k, "ue8m0" if gran_k == 32 else "fp32")  # test_quant covers the kernel


def weights(kind, *lead, N, K, device, gen):
    """(w bf16, q, s, gran_n, gran_k, unquantized tolerance) for kind 'v41' | 'v3' | 'fp4'."""
    if kind == "fp4":
        return (*random_fp4_weights(*lead, N=N, K=K, device=device, generator=gen), 1, 32, 1e-2)
    block, fmt = (32, "ue8m0") if kind == "v41" else (128, "fp32")
    return (*random_fp8_weights(*lead, N=N, K=K, block=block, scale_fmt=fmt, device=device, generator=gen), block, block, 1e-3)


def gemm_fn(kind, name):
    return getattr(dg, name.replace("fp8_", "fp8_fp4_") if kind == "fp4" else name)


CPU_SHAPES = [(1, 64, 128), (33, 96, 256), (130, 256, 512)]
GPU_SHAPES = [  # V4.1 shapes (N, K from the model) at a decode, a ragged and a prefill M
    (1, 1280, 5120), (77, 32768, 1280), (300, 512, 5120), (513, 5120, 8192), (4096, 4096, 1280),
    (4096, 4608, 5120), (129, 5120, 2304), (1000, 25600, 6144),
]


def shapes_for(device):
    return CPU_SHAPES if device == "cpu" else GPU_SHAPES


@pytest.mark.parametrize("kind", ["v41", "v3", "fp4"])
def test_dense_gemm(device, gen, kind, mma_path):
    for M, N, K in shapes_for(device):
        if kind == "v3" and (K % 128 or N % 128):
            continue
        w, bq, bs, gran_n, gran_k, tol = weights(kind, N=N, K=K, device=device, gen=gen)
        x = random_bf16(M, K, generator=gen).to(device)
        aq, as_ = quant_a(x, gran_k)
        d = torch.empty(M, N, dtype=torch.bfloat16, device=device)
        gemm_fn(kind, "fp8_gemm_nt")((aq, as_), (bq, bs), d)
        ref = reference.gemm_nt_ref(aq, as_, bq, bs, gran_n, gran_k)
        assert calc_diff(d, ref) < SAME_INPUTS_TOL, (M, N, K)
        assert calc_diff(d, x.float() @ w.float().T) < tol, (M, N, K)
        d2 = torch.empty_like(d)
        gemm_fn(kind, "fp8_gemm_nt")((aq, as_), (bq, bs), d2)
        assert torch.equal(d.view(torch.int16), d2.view(torch.int16)), "repeated runs must be bitwise identical"


def test_reference_matches_linear_refs(gen):
    x = random_bf16(9, 256, generator=gen)
    _, wq, ws = random_fp8_weights(N=64, K=256, block=32, scale_fmt="ue8m0", generator=gen)
    aq, as_ = reference.act_quant(x)
    assert torch.equal(reference.gemm_nt_ref(aq, as_, wq, ws, 32, 32).bfloat16(), reference.fp8_linear_ref(x, wq, ws))
    _, pq, ps = random_fp4_weights(N=64, K=256, generator=gen)
    assert torch.equal(reference.gemm_nt_ref(aq, as_, pq, ps, 1, 32).bfloat16(), reference.fp4_linear_ref(x, pq, ps))


def test_fp32_accumulate(device, gen, mma_path):
    M, N, K = (130, 256, 512) if device == "cpu" else (1000, 4608, 5120)
    _, bq, bs, *_ = weights("v41", N=N, K=K, device=device, gen=gen)
    aq, as_ = quant_a(random_bf16(M, K, generator=gen).to(device), 32)
    product = reference.gemm_nt_ref(aq, as_, bq, bs, 32, 32)
    c = torch.randn(M, N, device=device) * product.std()  # as large as the product, so a lost c shows
    d = c.clone()
    dg.fp8_gemm_nt((aq, as_), (bq, bs), d, c=d)  # accumulate in place
    assert calc_diff(d, c + product) < 1e-7


@pytest.mark.parametrize("few_rows", [False, True], ids=["ragged", "few-rows-per-group"])
@pytest.mark.parametrize("kind", ["fp4", "v41"])
def test_contiguous_grouped(device, gen, kind, mma_path, few_rows):
    """few_rows: few rows per group (the estimate of gemm.default_config), which swap-AB serves with 64 x 64 tiles
    at K >= 4096."""
    align = dg.get_m_alignment_for_contiguous_layout()
    if device == "cpu":
        rows, N, K = ([3, 0, 1, 130] if not few_rows else [1, 64, 0, 3]), 96, 256
    elif few_rows:
        rows, N, K = [64, 1, 0, 100, 128, 33, 64, 64], 4608, 5120
    else:
        rows, N, K = [300, 0, 1, 128, 1024, 77, 513, 0, 129], 4608, 5120
    layout = contiguous_layout(rows, align).to(device)
    G, M = len(rows), layout.numel()
    w, bq, bs, gran_n, gran_k, tol = weights(kind, G, N=N, K=K, device=device, gen=gen)
    x = random_bf16(M, K, generator=gen).to(device)
    aq, as_ = quant_a(x, gran_k)
    d = torch.full((M, N), 7.0, dtype=torch.bfloat16, device=device)
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_contiguous")((aq, as_), (bq, bs), d, layout)
    ref = reference.m_grouped_gemm_nt_contiguous_ref(aq, as_, bq, bs, layout, gran_n, gran_k)
    valid = layout >= 0
    assert calc_diff(d[valid], ref[valid]) < SAME_INPUTS_TOL
    assert bool((d[~valid] == 7.0).all()), "padding rows must be left untouched"
    ids = layout[valid].long()
    unquant = torch.einsum("mk,mnk->mn", x[valid].float(), w.float()[ids]) if device == "cpu" else None
    if unquant is not None:
        assert calc_diff(d[valid], unquant) < tol
    d2 = torch.full_like(d, 7.0)
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_contiguous")((aq, as_), (bq, bs), d2, layout)
    assert torch.equal(d.view(torch.int16), d2.view(torch.int16))


@pytest.mark.parametrize("kind", ["fp4", "v41"])
def test_masked_grouped(device, gen, kind, mma_path):
    if device == "cpu":
        masked, max_m, N, K = [0, 1, 5, 70], 70, 96, 256
    else:
        masked, max_m, N, K = [0, 1, 17, 64, 200, 3], 256, 4608, 5120
    G = len(masked)
    masked_m = torch.tensor(masked, dtype=torch.int32, device=device)
    w, bq, bs, gran_n, gran_k, tol = weights(kind, G, N=N, K=K, device=device, gen=gen)
    x = random_bf16(G, max_m, K, generator=gen).to(device)
    aq, as_ = quant_a(x, gran_k)
    d = torch.full((G, max_m, N), 7.0, dtype=torch.bfloat16, device=device)
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_masked")((aq, as_), (bq, bs), d, masked_m, expected_m=16)
    ref = reference.m_grouped_gemm_nt_masked_ref(aq, as_, bq, bs, masked_m, gran_n, gran_k)
    for g, m in enumerate(masked):
        assert calc_diff(d[g, :m], ref[g, :m]) < SAME_INPUTS_TOL, g
        assert bool((d[g, m:] == 7.0).all()), "rows past masked_m must be left untouched"
        if m:
            assert calc_diff(d[g, :m], x[g, :m].float() @ w[g].float().T) < tol
    d2 = torch.full_like(d, 7.0)
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_masked")((aq, as_), (bq, bs), d2, masked_m, expected_m=16)
    assert torch.equal(d.view(torch.int16), d2.view(torch.int16))


def test_fp4_weights_as_int8(device, gen):
    """The checkpoint stores packed FP4 as I8; int8 and uint8 views of the same bytes give the same result."""
    _, pq, ps = random_fp4_weights(N=128, K=256, device=device, generator=gen)
    aq, as_ = quant_a(random_bf16(40, 256, generator=gen).to(device), 32)
    d_u8, d_i8 = (torch.empty(40, 128, dtype=torch.bfloat16, device=device) for _ in range(2))
    dg.fp8_fp4_gemm_nt((aq, as_), (pq, ps), d_u8)
    dg.fp8_fp4_gemm_nt((aq, as_), (pq.view(torch.int8), ps), d_i8)
    assert torch.equal(d_u8.view(torch.int16), d_i8.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["v41", "fp4"])
def test_ue8m0_results_do_not_depend_on_the_batch(kind):
    """A row's product is bit-identical whatever the row count that carries it in a dense GEMM (1 to 4,096 rows:
    decode and prefill tiles), and, with FP4 weights, whatever the layout (dense, contiguous, masked): data-parallel
    ranks and recomputation after preemption depend on it. Dense GEMMs with FP8 weights run gemm_gluon_fp8_kernel's
    V4.1 kernel at every M where it runs (sm_90, triton 3.6; each tile shape computes a row the same way), else the
    bf16-MMA kernels; the grouped layouts with FP8 weights (no runtime caller) stay on bf16 MMAs, so they are
    checked bitwise against the dense bf16-MMA route and by calc_diff against the routed one. Every bf16-MMA path
    feeds the same MMAs in the same K order (gemm.default_config; FP4 weights always take the swap-AB kernel, whose
    FP4 K order differs from gemm_kernel's)."""
    gen = torch.Generator().manual_seed(7)
    N, K = 4608, 5120
    w, bq, bs, *_ = weights(kind, N=N, K=K, device="cuda", gen=gen)
    x = random_bf16(4096, K, generator=gen).cuda()
    aq, as_ = quant_a(x, 32)
    dense = gemm_fn(kind, "fp8_gemm_nt")
    full = torch.empty(4096, N, dtype=torch.bfloat16, device="cuda")
    dense((aq, as_), (bq, bs), full)
    for M in (1, 17, 64, 65, 300, 1024):
        d = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        dense((aq[:M], as_[:M]), (bq, bs), d)
        assert torch.equal(d.view(torch.int16), full[:M].view(torch.int16)), f"dense M={M}"
    if kind == "v41":  # the grouped layouts below run bf16 MMAs: compare them with the dense bf16-MMA route
        from mini_deepgemm import gemm

        cfg = {k: v for k, v in gemm.default_config(gemm._DENSE, 4096, 32, True, N).items() if k != "GLUON_V41"}
        bf16_route = torch.empty_like(full)
        gemm._gemm(gemm._DENSE, (aq, as_), (bq, bs), bf16_route, None, None, None, False, config=cfg)
        assert calc_diff(bf16_route, full) < 1e-5
        full = bf16_route
    align = dg.get_m_alignment_for_contiguous_layout()
    layout = contiguous_layout([3, 130], align).cuda()  # group 1 holds rows 0..129 of x
    rows = torch.full((layout.numel(),), 0, dtype=torch.long)
    rows[align: align + 130] = torch.arange(130)
    gq, gs = aq[rows.cuda()], as_[rows.cuda()]
    d = torch.empty(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_contiguous")((gq, gs), (torch.stack([bq, bq]), torch.stack([bs, bs])), d, layout)
    assert torch.equal(d[align: align + 130].view(torch.int16), full[:130].view(torch.int16)), "contiguous"
    mq, ms_ = aq[:64].unsqueeze(0).contiguous(), as_[:64].unsqueeze(0).contiguous()
    d = torch.empty(1, 64, N, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.tensor([37], dtype=torch.int32, device="cuda")
    gemm_fn(kind, "m_grouped_fp8_gemm_nt_masked")((mq, ms_), (bq[None], bs[None]), d, masked_m, expected_m=8)
    assert torch.equal(d[0, :37].view(torch.int16), full[:37].view(torch.int16)), "masked"


def test_empty_outputs(device):
    aq = torch.empty(0, 64, device=device).to(torch.float8_e4m3fn)
    as_ = torch.empty(0, 2, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
    bq = torch.randn(32, 64, device=device).to(torch.float8_e4m3fn)
    bs = torch.full((1, 2), 127, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
    dg.fp8_gemm_nt((aq, as_), (bq, bs), torch.empty(0, 32, dtype=torch.bfloat16, device=device))


class TestValidation:
    def operands(self, M=4, N=64, K=128):
        aq, as_ = reference.act_quant(torch.randn(M, K))
        bq, bs = reference.weight_quant_fp8(torch.randn(N, K))
        return (aq, as_), (bq, bs), torch.empty(M, N, dtype=torch.bfloat16)

    def test_wrong_a_dtype(self):
        (aq, as_), b, d = self.operands()
        with pytest.raises(ValueError, match="a must be float8_e4m3fn"):
            dg.fp8_gemm_nt((aq.float(), as_), b, d)

    def test_wrong_scale_shape(self):
        (aq, as_), b, d = self.operands()
        with pytest.raises(ValueError, match="sa must be"):
            dg.fp8_gemm_nt((aq, as_[:, :2]), b, d)

    def test_mixed_scale_formats(self):
        (aq, as_), (bq, bs), d = self.operands()
        with pytest.raises(ValueError, match="both be UE8M0 or both float32"):
            dg.fp8_gemm_nt((aq, as_), (bq, reference.ue8m0_to_float(bs)), d)

    def test_wrong_output_shape(self):
        a, b, _ = self.operands()
        with pytest.raises(ValueError, match="d must be"):
            dg.fp8_gemm_nt(a, b, torch.empty(4, 65, dtype=torch.bfloat16))

    def test_accumulate_needs_fp32(self):
        a, b, d = self.operands()
        with pytest.raises(ValueError, match="fp32"):
            dg.fp8_gemm_nt(a, b, d, c=d)

    def test_fp4_needs_fp8_fp4_function(self):
        a, _, d = self.operands()
        pq, ps = reference.fp4_quant(torch.randn(64, 128))
        with pytest.raises(ValueError, match="fp8_fp4"):
            dg.fp8_gemm_nt(a, (pq, ps), d)

    def test_k_not_multiple_of_granularity(self):
        aq, as_ = reference.act_quant(torch.randn(4, 96), 32, "fp32")
        bq = torch.randn(64, 96).to(torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="multiple of the scale granularity"):
            dg.fp8_gemm_nt((aq, as_), (bq, torch.ones(1, 1)), torch.empty(4, 64, dtype=torch.bfloat16))

    def test_weight_scale_max_out_of_range(self):
        a, _, d = self.operands()
        pq, ps = reference.fp4_quant(torch.randn(64, 128))
        for bad in (-1, 256, 128.0):
            with pytest.raises(ValueError, match="weight_scale_max"):
                dg.m_grouped_fp8_fp4_gemm_nt_contiguous(a, (pq[None], ps[None]), d, torch.zeros(4, dtype=torch.int32),
                                                        weight_scale_max=bad)

    def test_grouped_layout_dtype(self):
        a, (bq, bs), d = self.operands()
        with pytest.raises(ValueError, match="grouped_layout must be int32"):
            dg.m_grouped_fp8_gemm_nt_contiguous(a, (bq[None], bs[None]), d, torch.zeros(4, dtype=torch.int64))

    def test_masked_m_shape(self):
        (aq, as_), (bq, bs), _ = self.operands()
        d = torch.empty(1, 4, 64, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="masked_m must be int32"):
            dg.m_grouped_fp8_gemm_nt_masked((aq[None], as_[None]), (bq[None], bs[None]), d, torch.zeros(2, dtype=torch.int32), 4)


@pytest.mark.parametrize("layout,rows,expected", [
    # (layout, real rows per group or expected_m, the kernel and tile default_config must pick)
    ("contiguous", 300, dict(GLUON_WS=True, BLOCK_M=128)),  # 1.15-1.20x the one-warpgroup kernel
    ("contiguous", 64, dict(GLUON_WS=True, BLOCK_M=64)),  # 1.25-1.31x the swap-AB kernel (fallback tile 64)
    ("contiguous", 40, dict(GLUON_WS=None, BLOCK_M=64)),  # not measured: stays on the swap-AB kernel
    ("masked", 8, dict(GLUON=True, GLUON_STAGES=4, BLOCK_M=16)),
    ("masked", 32, dict(GLUON=True, GLUON_STAGES=3, BLOCK_M=64)),  # each expert's weights streamed once
    ("masked", 48, dict(GLUON=None, BLOCK_M=64)),  # the swap-AB kernel, in-tile dequantization
])
def test_fp4_grouped_routes_follow_the_h200_measurements(layout, rows, expected):
    """The FP4 MoE GEMM routes session 13 measured (docs/reports/deepgemm-gluon-fp4-ws.md, deepgemm-gluon.md).
    Contiguous: rows_hint as the runtime's fixed-size layouts give it (real rows + groups x (alignment - 1));
    masked: expected_m. The Gluon kernels then run where _use_gluon allows (H200, triton 3.6), the swap-AB kernel
    at BLOCK_M elsewhere; a config read here decides both."""
    from mini_deepgemm import gemm

    groups = 96
    if layout == "contiguous":
        cfg = gemm.default_config(gemm._CONTIGUOUS, rows * groups + groups * 127, 32, True, 4608, groups, True)
    else:
        cfg = gemm.default_config(gemm._MASKED, rows, 32, True, 4608, groups, True)
    assert {k: cfg.get(k) for k in expected} == expected, cfg


@pytest.mark.parametrize("M,N,K,block_n", [
    (4096, 1280, 5120, 128), (4096, 512, 5120, 128), (4096, 32768, 1280, 256), (4096, 5120, 8192, 256),
    (4096, 4096, 1280, 256), (4096, 4608, 5120, 128), (4096, 5120, 2304, 256), (4096, 25600, 6144, 128),
    (16384, 1280, 5120, 256), (16384, 512, 5120, 256), (16384, 5120, 8192, 128), (16384, 4608, 5120, 128),
    (16384, 5120, 2304, 256), (16384, 25600, 6144, 256), (16384, 4608, 5248, 256), (64, 4096, 5120, 128)])
def test_v3_tile_columns_follow_the_measurements(monkeypatch, M, N, K, block_n):
    """The V3 Gluon kernel's 256-column tiles where sessions 14 and 64 measured them faster (docs/reports/
    deepgemm-gluon-v3.md): where 128 x 256 tiles fill >= 85% of the last wave on 132 SMs (wq_a at 4,096 rows: 160
    tiles, and wkv: 64, do not), unless K > 2,304 and the 128-column tiles, K steps in pairs, fill their waves >= 1.02x
    better (shared_w13 and engram_wkv at 4,096 rows, wo_b and shared_w13 at 16,384); an odd number of K steps (5,248:
    41) cannot take pairs."""
    from mini_deepgemm import gemm

    monkeypatch.setattr(gemm, "sm_count", lambda device: 132)
    assert gemm._gluon_v3_block_n(M, N, K, 128 if M > 64 else 64, torch.device("cpu")) == block_n


@pytest.mark.parametrize("block_n,K,want", [(256, 1280, (2, 3)), (256, 2304, (2, 3)), (256, 5120, (1, 4)),
                                            (128, 1280, (1, 4))])
def test_v3_second_store_buffer_on_short_k(block_n, K, want):
    """Two store buffers (and 3 ring stages, for their shared memory) for 256-column tiles up to K = 2,304, where
    session 63 measured them 1.00-1.04x (docs/reports/deepgemm-gluon-v3.md); an explicit choice stays."""
    from mini_deepgemm import gemm

    cfg = gemm.default_config(gemm._DENSE, 4096, 128, False)
    assert gemm._gluon_v3_store_bufs(block_n, K, cfg) == want
    assert gemm._gluon_v3_store_bufs(256, 1280, {**cfg, "GLUON_STORE_BUFS": 1}) == (1, cfg["GLUON_STAGES"])


def test_gluon_switch_gives_every_call_the_triton_route(monkeypatch):
    """MINI_DEEPGEMM_GLUON=0 turns the Gluon kernels off (the Triton route of other triton releases and other GPUs,
    tested and timed on Hopper with it: docs/reports/triton-route-on-hopper.md); any other value leaves the release's
    rule. gluon_usable is read once per process, hence the cache clears around each setting."""
    from mini_deepgemm import _backend

    def usable(value: str | None) -> bool:
        if value is None:
            monkeypatch.delenv("MINI_DEEPGEMM_GLUON", raising=False)
        else:
            monkeypatch.setenv("MINI_DEEPGEMM_GLUON", value)
        _backend.gluon_usable.cache_clear()
        return _backend.gluon_usable()

    try:
        release_rule = usable(None)
        assert usable("1") == release_rule
        assert not usable("0")
    finally:
        monkeypatch.undo()
        _backend.gluon_usable.cache_clear()
