"""The sequential V4.1 reference: primitives against the spec's formulas, decode-vs-prefill equivalence, the
index-K quirk, golden logits of the tiny checkpoint, and CPU vs CUDA."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mini_deepinfer.models.deepseek_v41 import load_reference, ops
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config

GOLDEN = Path(__file__).parent / "fixtures" / "tiny_golden_logits.json"
GOLDEN_PROMPTS = {"short": list(range(100, 137)), "mid": [(7 * i * i + 3 * i + 11) % 129000 for i in range(150)]}
GOLDEN_LOGIT_STRIDE, GOLDEN_BLOCK_STRIDE = 251, 7  # samples of the logits, of the first block (primes: no alignment)


# ------------------------------------------------------------------ primitives
def test_yarn_frequencies_match_the_formula():
    cfg = V41Config()
    assert cfg.yarn_correction_range() == (15, 25)
    compressed = ops.rope_freqs(cfg, cfg.layer_role(2))
    window = ops.rope_freqs(cfg, cfg.layer_role(0))
    for i in range(32):
        base_c = 1 / 160000 ** (2 * i / 64)
        ramp = min(max((i - 15) / 10, 0), 1)
        expect = base_c / 16 * ramp + base_c * (1 - ramp)
        assert math.isclose(compressed[i].item(), expect, rel_tol=1e-5)
        assert math.isclose(window[i].item(), 1 / 10000 ** (2 * i / 64), rel_tol=1e-5)


def test_rope_is_a_rotation_and_inverse_undoes_it():
    x = torch.randn(5, 3, 128)
    pos = torch.tensor([0, 1, 7, 1000, 65535])
    f = ops.rope_freqs(V41Config(), V41Config().layer_role(5))
    y = ops.apply_rope_(x.clone(), pos, f)
    assert torch.equal(y[..., :64], x[..., :64])  # only the last 64 dims rotate
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(ops.apply_rope_(y.clone(), pos, f, inverse=True), x, atol=1e-5)
    assert torch.equal(y[0], x[0])  # position 0 is the identity
    # pair (2i, 2i+1) rotates by pos * f_i
    a = pos[3] * f[0]
    assert torch.allclose(y[3, 0, 64], x[3, 0, 64] * torch.cos(a) - x[3, 0, 65] * torch.sin(a), atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_in_place_rope_rounds_like_a_cast_of_the_fp32_rotation(device):
    """apply_rope_ writes the rotated dims into x and returns x, bit for bit the fp32 rotation cast to bf16 once,
    i.e. the un-rotated dims followed by rot.to(bf16). Shapes of q, kv and the indexer's q."""
    cfg = V41Config()
    g = torch.Generator().manual_seed(3)
    for role in (cfg.layer_role(0), cfg.layer_role(2)):  # plain and YaRN frequencies
        f = ops.rope_freqs(cfg, role)
        for shape in [(33, cfg.num_attention_heads, cfg.head_dim), (33, cfg.head_dim),
                      (33, cfg.index_n_heads, cfg.index_head_dim)]:
            pos = torch.randint(0, 1 << 20, (shape[0],), generator=g).to(device)
            for inverse in (False, True):
                x = torch.randn(*shape, generator=g).bfloat16().to(device)
                want = ops.apply_rope_(x.float(), pos, f, inverse).bfloat16()
                assert ops.apply_rope_(x, pos, f, inverse) is x
                assert torch.equal(x.view(torch.int16), want.view(torch.int16)), (shape, inverse)


def test_sinkhorn_mixing_is_doubly_stochastic():
    cfg = tiny_config()
    g = torch.Generator().manual_seed(0)
    H = torch.randn(9, 4, cfg.hidden_size, generator=g).bfloat16()
    fn = torch.randn(24, 4 * cfg.hidden_size, generator=g) * 0.5 / (4 * cfg.hidden_size) ** 0.5
    pre, post, comb = ops.hc_mixes(H, fn, torch.tensor([1.0, 1.0, 1.0]), torch.randn(24, generator=g), cfg)
    assert torch.allclose(comb.sum(-2), torch.ones(9, 4), atol=1e-5)  # the last step normalises columns
    # rows converge as far as 20 Sinkhorn rounds get on these inputs (peaked softmax inputs converge slower)
    assert torch.allclose(comb.sum(-1), torch.ones(9, 4), atol=1e-3)
    assert ((pre > 0) & (pre < 1 + 1e-5)).all() and ((post > 0) & (post < 2)).all()


def test_compressor_pools_per_channel_softmax_over_the_group():
    g = torch.Generator().manual_seed(1)
    kv, sc = torch.randn(3, 2, 64, generator=g), torch.randn(3, 2, 64, generator=g)
    w = torch.ones(64).bfloat16()
    got = ops.compressor_pool(kv, sc, w, 1e-20)
    wts = torch.exp(sc) / torch.exp(sc).sum(1, keepdim=True)
    latent = (kv * wts).sum(1).bfloat16()
    assert torch.equal(got, ops.rmsnorm(latent, w, 1e-20))


def test_compressed_kv_rows_packed_before_the_round_trip_dequantize_to_the_reference_entry():
    """The engine packs ops.compressed_kv_rotated (one quantization); its rows must read back as the reference's
    round-tripped entry, bit for bit. Packing the entry itself would quantize twice, and an e4m3 scale per 16
    recomputed from a rounded amax can move (the case this checks against)."""
    from mini_flashmla.cache_layout import pack_compressed_kv_fp4, unpack_compressed_kv_fp4

    cfg = V41Config()
    g = torch.Generator().manual_seed(32)
    latent = (torch.randn(4000, 512, generator=g) * torch.rand(4000, 1, generator=g) * 3).bfloat16()
    pos, freqs = torch.arange(4000) * 4, ops.rope_freqs(cfg, cfg.layer_role(2))
    entry = ops.compressed_kv_entry(latent, pos, {}, freqs)
    rows = pack_compressed_kv_fp4(ops.compressed_kv_rotated(latent, pos, {}, freqs))
    assert torch.equal(unpack_compressed_kv_fp4(rows).to(entry.dtype), entry)
    twice = unpack_compressed_kv_fp4(pack_compressed_kv_fp4(entry)).to(entry.dtype)
    assert (twice != entry).any()  # why the engine does not pack the entry


def test_window_positions():
    wp = ops.window_positions(torch.tensor([0, 3, 200]), 128)
    assert wp[0, -1] == 0 and (wp[0, :-1] == -1).all()
    assert wp[1, -4:].tolist() == [0, 1, 2, 3] and (wp[1, :-4] == -1).all()
    assert wp[2].tolist() == list(range(73, 201))


# ------------------------------------------------------------------ whole model
@pytest.fixture(scope="module")
def tiny_refs():
    return {q: load_reference("tiny", config_overrides={"index_k_reference_quirk": q}) for q in (True, False)}


def _tokens(n, seed=5):
    return torch.randint(3, 129000, (n,), generator=torch.Generator().manual_seed(seed))


def _prefill_then_decode(ref, toks):
    st = ref.new_state()
    ref.forward(toks[:-1], 0, st)
    ref.capture = []
    out = ref.forward(toks[-1:], len(toks) - 1, st)[-1]
    cap = ref.capture
    ref.capture = None
    return out, [c[-1] for c in cap]


def _prefill(ref, toks):
    ref.capture = []
    out = ref.forward(toks, 0, ref.new_state())[-1]
    cap = ref.capture
    ref.capture = None
    return out, [c[-1] for c in cap]


@pytest.mark.parametrize("n", [101, 102, 161])
def test_intended_mode_decode_equals_longer_prefill(tiny_refs, n):
    """Prefill N then decode 1 == prefill N+1 at the last position. Not bit-exact: a 1-row and an N-row GEMM
    accumulate in different orders and FP8/FP4 requantization amplifies the last-bit differences (spec U10), so
    the check is per-layer cosine >= 0.99 and logits cosine >= 0.99 (seen: >= 0.996)."""
    ref = tiny_refs[False]
    toks = _tokens(n)
    dec, cap_d = _prefill_then_decode(ref, toks)
    pre, cap_p = _prefill(ref, toks)
    cos = [torch.nn.functional.cosine_similarity(a, b, dim=0).item() for a, b in zip(cap_d, cap_p)]
    assert min(cos) >= 0.99, cos
    assert torch.nn.functional.cosine_similarity(dec, pre, dim=0) >= 0.99


def test_reference_quirk_changes_exactly_the_even_decode_steps(tiny_refs, monkeypatch):
    """Spec 2.4: at a decode step closing no ratio-2 group (even position), the ratio-2 source scores against the
    last publisher's index keys (the ratio-1 source's, from the previous step). At odd positions both modes agree
    bit for bit; at even positions the quirk mode's layer-2 scores use exactly layer 4's keys."""
    import mini_deepinfer.models.deepseek_v41.reference as refmod

    toks = _tokens(81)
    # decode at position 80 (even): the two modes must differ
    even = [_prefill_then_decode(tiny_refs[q], toks)[0] for q in (True, False)]
    seen = []
    orig = refmod.indexer_scores_ref

    def spy(q, k, w, visible):
        seen.append(k.clone())
        return orig(q, k, w, visible)

    monkeypatch.setattr(refmod, "indexer_scores_ref", spy)
    ref = tiny_refs[True]
    st = ref.new_state()
    ref.forward(toks[:80], 0, st)
    layer4_keys = st.index_k[4].clone()
    seen.clear()
    ref.forward(toks[80:81], 80, st)  # position 80: even, no ratio-2 group closes
    assert torch.equal(seen[0], layer4_keys[: 81 // 2])  # layer 2 read layer 4's previous-step keys
    assert not torch.equal(even[0], even[1])
    monkeypatch.setattr(refmod, "indexer_scores_ref", orig)
    toks2 = _tokens(82)  # decode at position 81 (odd): the group closes, both modes bind layer 2's own keys
    a = _prefill_then_decode(tiny_refs[True], toks2)[0]
    b = _prefill_then_decode(tiny_refs[False], toks2)[0]
    assert torch.equal(a, b)


# The tiny random model amplifies rounding noise: every activation is fake-quantized to FP8 (a flipped rounding
# moves a value by a whole FP8 step) and the indexer's top-k picks flip with it. Measured on CPU (2026-11-30): a
# bf16 half-ulp change of 1% of the embedding entries moves the final logits to cosine 0.970-0.994 (3 seeds x the
# two golden prompts) while the first block's output stays at >= 0.9997. So CUDA vs CPU (other bf16 accumulation
# orders), and one CPU against another (the golden file), is held to that noise floor at the end, and tightly at
# the first block, where noise has not grown yet.
NOISE_FLOOR_FIRST_BLOCK_COSINE = 0.9995
NOISE_FLOOR_LOGITS_COSINE = 0.96
# One CPU against the golden file's: MKL's other code paths (MKL_CBWR=COMPATIBLE, ONEDNN_MAX_CPU_ISA=SSE41 on the
# AVX2 machine that wrote the file, 2026-12-01) gave logit cosines 0.987 / 0.966 and the same top-3 ids. A changed
# model or checkpoint lands far below 0.9.
GOLDEN_LOGITS_COSINE = 0.9


def _golden_values(ref):
    """Per golden prompt, from the last position: the final logits' top 8, mean and std, and a fixed sample of them
    (every GOLDEN_LOGIT_STRIDE-th vocabulary id); from the whole prompt, a fixed sample of the first block's output
    (every GOLDEN_BLOCK_STRIDE-th value), where rounding noise has not grown yet."""
    out = {}
    for name, prompt in GOLDEN_PROMPTS.items():
        ref.capture = []
        lg = ref.forward(torch.tensor(prompt), 0, ref.new_state())[-1]
        first_block = ref.capture[0].flatten()[::GOLDEN_BLOCK_STRIDE]
        ref.capture = None
        top = lg.topk(8)
        out[name] = {"top_ids": top.indices.tolist(), "top_logits": [round(v, 5) for v in top.values.tolist()],
                     "mean": round(lg.mean().item(), 6), "std": round(lg.std().item(), 6),
                     "logit_sample": [round(v, 5) for v in lg[::GOLDEN_LOGIT_STRIDE].tolist()],
                     "first_block_sample": [round(v, 5) for v in first_block.tolist()]}
    return out


def _cosine(a: list[float], b: list[float]) -> float:
    return F.cosine_similarity(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), dim=0).item()


def test_golden_logits_of_the_tiny_checkpoint(tiny_refs):
    """Catches changes to the reference or the tiny checkpoint. Regenerate deliberately with
    `python runtime/tests/test_reference_model.py` (and say why in the commit).

    Held to the rounding-noise floor below, not to exact values: the CPU's matmul kernels (AVX2 against AVX-512)
    sum in other orders, and the FP8 fake quantization amplifies that by the last block (2026-12-01, an AVX2 AMD EPYC
    against the machine that wrote the first golden file: top logits moved by up to 0.33, top-8 ids by 2-4 of 8,
    the mean by 1.0e-3, and this test failed). The first block's output stays at the tight cosine; a change to the
    model moves it (or, in a later block, the final logits) far past these bounds."""
    want = json.loads(GOLDEN.read_text())
    got = _golden_values(tiny_refs[True])
    for name in GOLDEN_PROMPTS:
        g, w = got[name], want[name]
        assert _cosine(g["first_block_sample"], w["first_block_sample"]) > NOISE_FLOOR_FIRST_BLOCK_COSINE, name
        assert _cosine(g["logit_sample"], w["logit_sample"]) > GOLDEN_LOGITS_COSINE, name
        assert abs(g["mean"] - w["mean"]) < 1e-2 and abs(g["std"] - w["std"]) < 1e-2, (name, g["mean"], g["std"])
        assert g["top_ids"][0] in w["top_ids"][:3], (name, g["top_ids"], w["top_ids"])




@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_reference_on_cuda_matches_cpu(tiny_refs):
    cpu = tiny_refs[True]
    gpu = load_reference("tiny", "cuda")
    for name, prompt in GOLDEN_PROMPTS.items():
        toks = torch.tensor(prompt)
        cpu.capture, gpu.capture = [], []
        a = cpu.forward(toks, 0, cpu.new_state())[-1]
        b = gpu.forward(toks, 0, gpu.new_state())[-1].cpu()
        per_block = [F.cosine_similarity(x.flatten(), y.cpu().flatten(), dim=0).item()
                     for x, y in zip(cpu.capture, gpu.capture)]
        cpu.capture = gpu.capture = None
        cos = F.cosine_similarity(a, b, dim=0).item()
        print(f"reference CUDA vs CPU [{name}]: logits max |diff| {(a - b).abs().max().item():.4f}, cosine {cos:.6f}; "
              f"per-block cosine {[round(c, 5) for c in per_block]}")
        assert per_block[0] > NOISE_FLOOR_FIRST_BLOCK_COSINE, (name, per_block)
        assert cos > NOISE_FLOOR_LOGITS_COSINE, (name, cos)


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_golden_values(load_reference("tiny")), indent=1) + "\n")
    print("wrote", GOLDEN)
