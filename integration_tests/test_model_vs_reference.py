"""The engine's batched, paged model against the sequential reference, below the engine (no scheduler):
the packed cache holds exactly the reference's fake-quantized state, and the CUDA kernel path (mini-deepgemm
linears, mini-flashmla attention and indexer) reproduces the reference's logits and greedy tokens."""

import dataclasses

import pytest
import torch
from mini_flashmla.cache_layout import unpack_compressed_kv_fp4, unpack_index_k_fp4, unpack_window_fp8

from mini_deepinfer.models.deepseek_v41 import load_checkpoint, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.checkpoint import build_random_weights
from mini_deepinfer.models.deepseek_v41.config import tiny_config
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.models.deepseek_v41.reference import ReferenceV41
from mini_deepinfer.worker.forward_batch import ForwardBatch

PROMPT_LENS = (37, 150, 260)
BLOCK_TABLES = [[1, 2], [3, 4, 5], [6, 7, 8, 9]]


@pytest.fixture(scope="module")
def tiny():
    return load_checkpoint(resolve_checkpoint("tiny"))


def _prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 129000, (n,), generator=g) for n in PROMPT_LENS]


def test_packed_cache_equals_reference_state_bit_for_bit(tiny):
    cfg, w = tiny
    model, ref = V41Model(cfg, w), ReferenceV41(cfg, w)
    prompt = _prompts()[2]
    cache = V41Cache(cfg, num_blocks=8, num_slots=2)
    model(ForwardBatch(prompt, [len(prompt)], [0], [[3, 1, 5]], [1], [len(prompt) - 1]), cache)
    st = ref.new_state()
    ref.forward(prompt, 0, st)
    W, n = cfg.sliding_window, len(prompt)
    for lid, ring in st.window.items():
        rows = 1 * W + torch.arange(n - W, n) % W
        assert torch.equal(unpack_window_fp8(cache.window[lid][rows]), ring[torch.arange(n - W, n) % W]), lid
    for lid, ckv in st.compress_kv.items():
        r = cfg.compress_ratios[lid]
        rows = V41Cache.entry_rows([3, 1, 5], torch.arange(ckv.shape[0]), r)
        assert torch.equal(unpack_compressed_kv_fp4(cache.compressed_kv[lid][rows]), ckv), lid
        assert torch.equal(unpack_index_k_fp4(cache.index_k[lid][rows]), st.index_k[lid]), lid


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernel_path_matches_reference(tiny):
    """Batched prefill of three prompts then 4 batched decode steps on CUDA (kernels) vs the CPU reference run
    sequence by sequence.

    Tolerance. The first block's output (before noise can grow) is held tightly: cosine >= 0.999 per prompt. The
    logits are held to the tiny random model's noise floor: each kernel rounds its bf16 output from fp32 sums in
    another order, a rounding flip moves an FP8 fake-quantized value by a whole step, and 8 layers amplify it.
    Measured on CPU, a half-ulp change of 1% of the embedding entries alone gives logits cosine 0.970-0.994; the
    reference itself on CUDA vs CPU gives 0.987-0.994; this path gave a minimum of 0.956 over the 15 (prompt,
    step) pairs on H200 (2026-11-30). Bar: cosine >= 0.93 per step. Greedy tokens are printed, not asserted: at
    this noise (max |logit diff| ~0.5) a top-2 margin above 0.1 still flipped once on H200; the engine-level
    tests (test_engine_vs_reference.py, every scheduling mode on CUDA) assert the engine's greedy tokens."""
    _check_cuda_kernel_path(*tiny)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon_attention", "triton_attention"])
def test_cuda_kernel_path_matches_reference_at_64_heads(monkeypatch, gluon):
    """The same check with V4.1-Flash's 64 attention heads (tiny_config() otherwise, random weights in memory): the
    batched prefill (447 query tokens, one 64-head program each) takes mini-flashmla's Gluon attention kernel where
    it runs (sm_90, triton 3.6), which the 4-head model never does; so do the decode steps (3 programs), split over
    their slots since session 26. The triton_attention case is the control: the same model with the Gluon route off.

    Bars: the first block as in the 4-head test (>= 0.999; measured >= 0.9999 in both cases); the logits at this
    model's noise floor, as a mean over the 15 (prompt, step) pairs (>= 0.96) and a minimum (>= 0.90). Why not the
    4-head test's 0.93 minimum: this model (64 heads, seed 1017) amplifies noise more. Session 12 (H200, runs 1-2,
    before the V4.1 GEMM route changed): Gluon case minimum 0.9255 (prompt 3, step 5; mean 0.975), Triton control
    0.9478 (mean 0.983); on CPU, the reference against itself with one bf16 ulp added to 1% of the embedding entries:
    minimum 0.947 / 0.944 / 0.957, mean ~0.98 (3 seeds). The kernel itself is held tightly by mini-flashmla's
    tests (relative L2 1.2e-5 against the Triton kernel, 1.2e-4 against the reference, as the Triton kernel's)."""
    from mini_flashmla import api

    cfg = dataclasses.replace(tiny_config(), num_attention_heads=64)
    weights = build_random_weights(cfg, seed=1017)
    calls = []
    launch = api._launch_gluon
    monkeypatch.setattr(api, "_launch_gluon", lambda *a: calls.append(1) or launch(*a))
    if not gluon:
        monkeypatch.setattr(api, "_gluon_runs_on", lambda *a: False)
    prefill_q = torch.empty(1, 64, 512, dtype=torch.bfloat16, device="cuda").expand(sum(PROMPT_LENS), -1, -1)
    gluon_possible = api._gluon_runs_on(prefill_q, torch.empty(1, 528, dtype=torch.uint8, device="cuda"))
    _check_cuda_kernel_path(cfg, weights, min_logits_cos=0.90, mean_logits_cos=0.96)
    assert (len(calls) > 0) == gluon_possible, (len(calls), gluon_possible)


def _check_cuda_kernel_path(cfg, w, min_logits_cos: float = 0.93, mean_logits_cos: float = 0.0):
    """Batched prefill of _prompts() then 4 teacher-forced decode steps of V41Model on CUDA against ReferenceV41 on
    CPU; first-block cosine >= 0.999 per prompt, logits cosine >= min_logits_cos per step and >= mean_logits_cos
    on average (see the 4-head and 64-head tests)."""
    model = V41Model(cfg, w, "cuda")
    ref = ReferenceV41(cfg, w)
    prompts = _prompts()
    ref_logits, ref_first_block = [], []
    for pr in prompts:
        st = ref.new_state()
        ref.capture = []
        out = [ref.forward(pr, 0, st)[-1]]
        ref_first_block.append(ref.capture[0])
        ref.capture = None
        for i in range(4):
            out.append(ref.forward(out[-1].argmax().view(1), len(pr) + i, st)[-1])
        ref_logits.append(torch.stack(out))
    cache = V41Cache(cfg, num_blocks=16, num_slots=4, device="cuda")
    lens = [len(p) for p in prompts]
    rows = list(torch.tensor(lens).cumsum(0) - 1)
    model.capture = []
    got = [model(ForwardBatch(torch.cat(prompts).cuda(), lens, [0, 0, 0], BLOCK_TABLES, [1, 2, 3],
                              [int(r) for r in rows]), cache).cpu()]
    first_block = model.capture[0].cpu().split(lens)
    model.capture = None
    for d in range(4):
        toks = torch.stack([ref_logits[i][d].argmax() for i in range(3)]).cuda()  # teacher-forced on the reference
        got.append(model(ForwardBatch(toks, [1, 1, 1], [n + d for n in lens], BLOCK_TABLES, [1, 2, 3], [0, 1, 2]),
                         cache).cpu())
    got = torch.stack(got, 1)  # [3, 5, vocab]
    cos = torch.nn.functional.cosine_similarity
    block_cos = [cos(a.flatten(), b.flatten(), dim=0).item() for a, b in zip(first_block, ref_first_block)]
    step_cos = [[cos(got[i, step], ref_logits[i][step], dim=0).item() for step in range(5)] for i in range(3)]
    worst = max((got[i, s] - ref_logits[i][s]).abs().max().item() for i in range(3) for s in range(5))
    print(f"CUDA kernel path vs CPU reference: first-block cosine {[round(c, 5) for c in block_cos]}; logits cosine "
          f"per prompt and step {[[round(c, 4) for c in row] for row in step_cos]}; max |logit diff| {worst:.4f}; "
          f"mean logits cosine {sum(map(sum, step_cos)) / 15:.4f}")
    assert min(block_cos) >= 0.999, block_cos
    assert min(min(row) for row in step_cos) >= min_logits_cos, step_cos
    assert sum(map(sum, step_cos)) / 15 >= mean_logits_cos, step_cos
    same = sum(int(got[i, s].argmax() == ref_logits[i][s].argmax()) for i in range(3) for s in range(5))
    print(f"greedy tokens equal in {same} of 15 (prompt, step) pairs")


def test_indexer_query_slices_change_nothing(tiny, monkeypatch):
    """The prefill indexer scores its queries in slices of INDEXER_QUERY_SLICE (memory for long chunks): with a
    slice of 7 rows (every prompt spans several slices, the last one ragged) the logits and the cache are the
    same bit for bit as with one slice per sequence."""
    import mini_deepinfer.models.deepseek_v41.model as model_module

    cfg, w = tiny
    model = V41Model(cfg, w)
    prompts = _prompts()
    batch = ForwardBatch(torch.cat(prompts), list(PROMPT_LENS), [0, 0, 0], BLOCK_TABLES, [1, 2, 3],
                         list(torch.tensor(PROMPT_LENS).cumsum(0) - 1))
    outs = []
    for rows in (4096, 7):
        monkeypatch.setattr(model_module, "INDEXER_QUERY_SLICE", rows)
        cache = V41Cache(cfg, num_blocks=10, num_slots=4)
        outs.append((model(batch, cache), cache))
    (a, ca), (b, cb) = outs
    assert torch.equal(a, b)
    for lid in ca.index_k:
        assert torch.equal(ca.index_k[lid], cb.index_k[lid]) and torch.equal(ca.compressed_kv[lid], cb.compressed_kv[lid])
