"""Deterministic sampling: the hash is SplitMix64, tokens depend only on (logits, seed, position), filters hold,
frequencies follow the softmax, and on CUDA the Triton kernel equals the torch reference bit for bit."""

from __future__ import annotations

import pytest
import torch

from mini_deepinfer.layers.sampler import (
    SamplingBatch,
    apply_top_k_top_p,
    gumbel_argmax_torch,
    mix64,
    sample,
    sample_keys,
)

M64 = (1 << 64) - 1


def splitmix64_finalizer(z: int) -> int:
    """Textbook SplitMix64 output function on Python ints (the oracle for the int64 tensor emulation)."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def as_signed(z: int) -> int:
    return z - (1 << 64) if z >= 1 << 63 else z


def batch(rows: int, temperature=1.0, top_k=-1, top_p=1.0, seeds=None, positions=None, device="cpu"):
    seeds = seeds if seeds is not None else [1000 + r for r in range(rows)]
    positions = positions if positions is not None else [r % 7 for r in range(rows)]
    return SamplingBatch.build([temperature] * rows, [top_k] * rows, [top_p] * rows, seeds, positions, device)


def test_mix64_is_splitmix64_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    z = torch.randint(-(2**63), 2**63 - 1, (4096,), generator=g, dtype=torch.int64)
    z = torch.cat([z, torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)])])
    got = mix64(z).tolist()
    want = [as_signed(splitmix64_finalizer(v)) for v in z.tolist()]
    assert got == want


def test_same_seed_and_position_same_token_and_other_seeds_differ():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(1))
    a = sample(logits, batch(1, seeds=[5], positions=[3]))
    b = sample(logits, batch(1, seeds=[5], positions=[3]))
    assert torch.equal(a, b)
    flat = torch.zeros(1, 1000)  # all tokens equally likely: the token is pure noise
    draws = {int(sample(flat, batch(1, seeds=[s], positions=[0]))) for s in range(50)}
    draws |= {int(sample(flat, batch(1, seeds=[5], positions=[p]))) for p in range(50)}
    assert len(draws) > 80


@pytest.mark.parametrize("vocab", [1, 7, 1000, 129280])
def test_batch_invariance_one_row_many_rows_and_reversed(vocab):
    rows = 9
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 2
    sb = batch(rows, temperature=0.7)
    many = sample(logits, sb)
    one_by_one = torch.cat(
        [sample(logits[r : r + 1], batch(1, 0.7, seeds=[1000 + r], positions=[r % 7])) for r in range(rows)]
    )
    rev = torch.arange(rows - 1, -1, -1).tolist()
    reversed_ = sample(logits[rev], batch(rows, 0.7, seeds=[1000 + r for r in rev], positions=[r % 7 for r in rev]))
    assert torch.equal(many, one_by_one) and torch.equal(many, reversed_[rev])


def test_greedy_is_argmax_with_ties_to_the_lowest_id():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(2))
    logits[3, [10, 20]] = 100.0  # exact tie
    got = sample(logits, batch(5, temperature=0.0))
    assert torch.equal(got, logits.argmax(-1)) and int(got[3]) == 10


def test_top_k_and_top_p_keep_the_right_sets():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 200, generator=g)
    top5 = logits.topk(5, dim=-1).indices
    for pos in range(20):
        tok = sample(logits, batch(64, temperature=2.0, top_k=5, positions=[pos] * 64))
        assert (top5 == tok[:, None]).any(-1).all()
    # top-p: the kept set is the shortest prefix (by probability) whose mass reaches p
    probs = (logits / 0.9).softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    need = ((sorted_p.cumsum(-1) - sorted_p) < 0.5).sum(-1)
    filtered = apply_top_k_top_p(logits, torch.full((64,), 0.9, dtype=torch.float64), torch.full((64,), -1),
                                 torch.full((64,), 0.5))
    assert torch.equal(torch.isfinite(filtered).sum(-1), need)
    for r in range(64):
        assert set(order[r, : need[r]].tolist()) == set(torch.isfinite(filtered[r]).nonzero().flatten().tolist())
    # top_k = 1 is greedy whatever the temperature
    assert torch.equal(sample(logits, batch(64, temperature=5.0, top_k=1)), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [1e-38, 1e-45])
def test_a_vanishing_temperature_with_filters_samples_the_top_logit(temperature):
    """logits / temperature overflows fp32 near 1e-38, the scaled softmax is NaN, and the filter once kept no entry
    and indexed -1: the step raised and took every request of the engine with it. The top entry now always stays."""
    logits = torch.randn(16, 200, generator=torch.Generator().manual_seed(5))
    for top_k, top_p in ((-1, 0.9), (5, 1.0), (3, 0.5)):
        tokens = sample(logits, batch(16, temperature=temperature, top_k=top_k, top_p=top_p))
        assert torch.equal(tokens, logits.argmax(-1)), (top_k, top_p)


def test_frequencies_follow_the_tempered_softmax():
    """Chi-square over 6000 positions of one row; bar: p-value > 1e-4 (fails ~1 in 10^4 for a correct sampler)."""
    vocab, n, temp = 8, 6000, 0.8
    logits = torch.tensor([[0.0, 0.5, 1.0, -1.0, 2.0, 0.1, -0.5, 1.5]])
    rows = logits.expand(n, vocab).contiguous()
    tokens = sample(rows, batch(n, temperature=temp, seeds=[42] * n, positions=list(range(n))))
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = (logits[0] / temp).softmax(-1).double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 29.88  # upper 1e-4 quantile of chi-square with 7 degrees of freedom


def test_keys_depend_on_seed_and_position_only():
    keys = sample_keys(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]))
    assert len(set(keys.tolist())) == 3
    assert torch.equal(keys[:1], sample_keys(torch.tensor([1]), torch.tensor([0])))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows,vocab", [(1, 129280), (7, 1000), (64, 129280), (3, 2049), (5, 1)])
def test_triton_kernel_is_bit_identical_to_the_torch_reference(rows, vocab):
    from mini_deepinfer.layers.sampler import gumbel_argmax_triton

    g = torch.Generator().manual_seed(rows * vocab)
    logits = (torch.randn(rows, vocab, generator=g) * 3).cuda()
    temps = torch.tensor([[0.0, 0.5, 1.0, 1.7][r % 4] for r in range(rows)], dtype=torch.float64, device="cuda")
    keys = sample_keys(torch.arange(rows, device="cuda") * 977 - 5, torch.arange(rows, device="cuda") % 11)
    out = torch.empty(rows, dtype=torch.int64, device="cuda")
    triton_tokens = gumbel_argmax_triton(logits, temps, keys, out)
    torch_cuda = gumbel_argmax_torch(logits, temps, keys)
    torch_cpu = gumbel_argmax_torch(logits.cpu(), temps.cpu(), keys.cpu())
    assert torch.equal(triton_tokens, torch_cuda)
    assert torch.equal(triton_tokens.cpu(), torch_cpu)
    # the vocabulary slices per program do not change a token: 2,048 (many slices), one slice per row
    for vocab_slice in (2048, -(-vocab // 2048) * 2048):
        sliced = gumbel_argmax_triton(logits, temps, keys, torch.empty_like(out), vocab_slice=vocab_slice)
        assert torch.equal(sliced, torch_cuda), vocab_slice
    # a row alone gives the same token as in the batch
    for r in range(min(rows, 3)):
        alone = gumbel_argmax_triton(logits[r : r + 1], temps[r : r + 1], keys[r : r + 1], out[:1].clone())
        assert int(alone) == int(triton_tokens[r])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernel_ties_across_vocabulary_slices_go_to_the_lowest_id():
    from mini_deepinfer.layers.sampler import VOCAB_SLICE, gumbel_argmax_triton

    vocab = 129280
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(4)).cuda()
    logits[0, [VOCAB_SLICE + 5, 3 * VOCAB_SLICE + 1]] = 50.0  # tie in two later slices
    logits[1, [vocab - 1, 2]] = 50.0  # tie between the last slice and the first
    logits[2] = float("-inf")  # slices of only -inf (they report id 0) around a tie in slices 1 and 2
    logits[2, [VOCAB_SLICE, 2 * VOCAB_SLICE]] = 1.0
    temps = torch.zeros(3, dtype=torch.float64, device="cuda")
    keys = sample_keys(torch.arange(3, device="cuda"), torch.zeros(3, dtype=torch.int64, device="cuda"))
    got = gumbel_argmax_triton(logits, temps, keys, torch.empty(3, dtype=torch.int64, device="cuda"))
    assert got.tolist() == [VOCAB_SLICE + 5, 2, VOCAB_SLICE]
    assert torch.equal(got, gumbel_argmax_torch(logits, temps, keys))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_on_cuda_with_filters_matches_cpu():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(32, 5000, generator=g) * 2
    for kw in (dict(temperature=0.0), dict(temperature=0.9, top_p=0.8), dict(temperature=1.2, top_k=40)):
        cpu = sample(logits, batch(32, **kw))
        gpu = sample(logits.cuda(), batch(32, device="cuda", **kw))
        assert torch.equal(cpu, gpu.cpu()), kw
