"""Deterministic, batch-invariant sampling: Gumbel-max with noise keyed only on (sequence seed, output position).

    key   = mix64(seq_seed + (position + 1) * GOLDEN)          # one key per sampled row
    bits  = mix64(key + (token_id + 1) * GOLDEN)               # one 64-bit draw per (row, vocabulary entry)
    u     = ((bits >>> 11) | 1) * 2**-53                       # odd multiple of 2**-53: exactly in (0, 1)
    token = argmax(logits / temperature - log(-log(u)))       # temperature 0: argmax(logits)

`mix64` is the SplitMix64 finalizer. A row's token depends only on its own logits, seed and position, never on
the batch row or a global RNG, so one-row and many-row batches, any row order, and a recomputation after
preemption all draw the same token. Everything up to `u` is integer arithmetic on int64 tensors (two's-complement
wrap-around, a logical shift emulated by masking), identical on CPU and CUDA; the noise and the scores are float64.

Two implementations of the same formula: `gumbel_argmax_torch` (any device; the reference) and
`gumbel_argmax_triton` (CUDA, no [rows, vocab] temporaries): a program per (row, 8,192-entry slice of the
vocabulary) keeps the slice's best (score, id), a second kernel picks each row's best slice. The split is exact (a
max, ties to the lowest id in both stages), so it does not change any token. One program per row streaming the
whole vocabulary left most SMs idle at decode batch sizes: 596 us per step at batch 32 in session 15's profile of
the medium model's decode (docs/reports/runtime-decode.md).
On one GPU they are meant to agree bit for bit (both use the CUDA float64 `log`; test_sampler.py checks it on
CUDA, the Triton interpreter agreed on CPU); across CPU and GPU only a 1-ulp difference of float64 `log` could flip
an exact near-tie.
top-k / top-p run before either, in plain torch (`apply_top_k_top_p`), only when some row asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_deepinfer.worker.forward_batch import host_to_device


def _as_int64(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN = _as_int64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, SplitMix64's increment
MIX_MUL_1 = _as_int64(0xBF58476D1CE4E5B9)
MIX_MUL_2 = _as_int64(0x94D049BB133111EB)
TWO_POW_MINUS_53 = 2.0**-53


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> on int64 is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer on int64 tensors (bijective; wraps like uint64)."""
    z = (z ^ _shr(z, 30)) * MIX_MUL_1
    z = (z ^ _shr(z, 27)) * MIX_MUL_2
    return z ^ _shr(z, 31)


def sample_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [R] keys from int64 [R] sequence seeds and int64 [R] output positions."""
    return mix64(seeds + (positions + 1) * GOLDEN)


def gumbel_argmax_torch(logits: torch.Tensor, temperatures: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Reference Gumbel-max. logits fp32 [R, V]; temperatures float64 [R] (0 = greedy); keys int64 [R].

    Returns int64 [R] token ids; ties go to the lowest id.
    """
    vocab = logits.shape[1]
    cols = torch.arange(1, vocab + 1, device=logits.device, dtype=torch.int64)
    bits = mix64(keys[:, None] + cols * GOLDEN)
    u = (_shr(bits, 11) | 1).to(torch.float64) * TWO_POW_MINUS_53
    noise = -torch.log(-torch.log(u))
    x = logits.to(torch.float64)
    t = temperatures[:, None]
    scores = torch.where(t == 0, x, x / t + noise)
    return scores.argmax(dim=-1)


try:  # Triton is optional: CPU installs run the torch reference only
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:
    triton = None

if triton is not None:
    # Triton kernels may only read constexpr globals, so the SplitMix64 constants appear as literals here (the same
    # int64 values as GOLDEN, MIX_MUL_1, MIX_MUL_2; the bit-identity test holds them together).

    @triton.jit
    def _shr_tl(z, k: tl.constexpr):
        return (z >> k) & ((1 << (64 - k)) - 1)

    @triton.jit
    def _mix64_tl(z):
        z = (z ^ _shr_tl(z, 30)) * -4658895280553007687  # 0xBF58476D1CE4E5B9
        z = (z ^ _shr_tl(z, 27)) * -7723592293110705685  # 0x94D049BB133111EB
        return z ^ _shr_tl(z, 31)

    @triton.jit
    def _best_of_block(scores, start, best_val, best_idx):
        """(best_val, best_idx) after a block of scores whose first id is start: strictly better replaces, so an
        equal score in a later block keeps the lower id."""
        block_best = tl.max(scores, axis=0)
        block_idx = tl.argmax(scores, axis=0, tie_break_left=True).to(tl.int64) + start
        better = block_best > best_val
        return tl.where(better, block_best, best_val), tl.where(better, block_idx, best_idx)

    @triton.jit
    def _gumbel_argmax_slice_kernel(logits_ptr, row_stride, temps_ptr, keys_ptr, best_val_ptr, best_idx_ptr, vocab,
                                    SLICE: tl.constexpr, BLOCK: tl.constexpr):
        """Grid (rows, slices): the best (score, id) of vocabulary entries [slice * SLICE, (slice + 1) * SLICE) of a
        row into best_val / best_idx [rows, slices] (float64 / int64); a slice of only -inf keeps (-inf, 0).
        A greedy row (temperature 0) scores the logits alone and skips the noise (two float64 logs per entry): a
        loop of its own, so the sampled rows' loop carries no branch (session 43: a branch per block ran sampled
        rows up to 1.12x slower)."""
        row = tl.program_id(0)
        part = tl.program_id(1)
        temp = tl.load(temps_ptr + row)
        key = tl.load(keys_ptr + row)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        best_val = tl.full([], float("-inf"), tl.float64)
        best_idx = tl.full([], 0, tl.int64)
        if temp == 0:
            for start in tl.range(part * SLICE, part * SLICE + SLICE, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
                best_val, best_idx = _best_of_block(x.to(tl.float64), start, best_val, best_idx)
        else:
            for start in tl.range(part * SLICE, part * SLICE + SLICE, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                in_vocab = cols < vocab
                x = tl.load(row_ptr + cols, mask=in_vocab, other=float("-inf")).to(tl.float64)
                bits = _mix64_tl(key + (cols.to(tl.int64) + 1) * -7046029254386353131)  # 0x9E3779B97F4A7C15
                u = (_shr_tl(bits, 11) | 1).to(tl.float64) * 1.1102230246251565e-16  # 2**-53, exact
                noise = -libdevice.log(-libdevice.log(u))
                scores = tl.where(in_vocab, x / temp + noise, float("-inf"))
                best_val, best_idx = _best_of_block(scores, start, best_val, best_idx)
        n_slices = tl.num_programs(1)
        tl.store(best_val_ptr + row * n_slices + part, best_val)
        tl.store(best_idx_ptr + row * n_slices + part, best_idx)

    @triton.jit
    def _best_slice_kernel(best_val_ptr, best_idx_ptr, out_ptr, n_slices, SLICES_POW2: tl.constexpr):
        """Grid (rows,): out[row] = the id of the row's best slice score, the lowest id among equal scores."""
        row = tl.program_id(0)
        offs = tl.arange(0, SLICES_POW2)
        valid = offs < n_slices
        vals = tl.load(best_val_ptr + row * n_slices + offs, mask=valid, other=float("-inf"))
        ids = tl.load(best_idx_ptr + row * n_slices + offs, mask=valid, other=0)
        best = tl.max(vals, axis=0)
        ids = tl.where(valid & (vals == best), ids, 9223372036854775807)
        tl.store(out_ptr + row, tl.min(ids, axis=0))


VOCAB_SLICE = 8192  # 16 slices of V4.1's 129,280 entries: 512 programs at batch 32


def gumbel_argmax_triton(
    logits: torch.Tensor, temperatures: torch.Tensor, keys: torch.Tensor, out: torch.Tensor,
    vocab_slice: int = VOCAB_SLICE, block: int = 2048,
) -> torch.Tensor:
    """Same contract as `gumbel_argmax_torch`, written into the caller's `out` (int64 [R], CUDA).

    vocab_slice (a multiple of block): vocabulary entries per program; any value gives the same tokens (the
    benchmark passes the vocabulary size to time one program per row)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("gumbel_argmax_triton: logits rows must be contiguous")
    if triton is None:
        raise RuntimeError("gumbel_argmax_triton needs Triton; use gumbel_argmax_torch")
    if vocab_slice % block:
        raise ValueError(f"gumbel_argmax_triton: vocab_slice {vocab_slice} is not a multiple of block {block}")
    if rows:
        slices = max(1, -(-vocab // vocab_slice))
        best_val = torch.empty(rows, slices, dtype=torch.float64, device=logits.device)
        best_idx = torch.empty(rows, slices, dtype=torch.int64, device=logits.device)
        # enable_fp_fusion=True at every launch: FMA contraction as the kernels were tested and timed, not left to
        # triton's default, which turns it off from 3.10 (docs/reports/kernels-compile-sm90.md, "Session 49")
        _gumbel_argmax_slice_kernel[(rows, slices)](logits, logits.stride(0), temperatures, keys, best_val, best_idx,
                                                    vocab, SLICE=vocab_slice, BLOCK=block, enable_fp_fusion=True)
        _best_slice_kernel[(rows,)](best_val, best_idx, out, slices, SLICES_POW2=triton.next_power_of_2(slices),
                                    enable_fp_fusion=True)
    return out


def apply_top_k_top_p(
    logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k and then top-p set (temperature-scaled probabilities).

    logits fp32 [R, V]; temperatures float64 [R]; top_k int64 [R] (-1 = all); top_p float32 [R] (1 = all).
    The kept set is a prefix of the row sorted by logit; values tied with the last kept one are kept too. The top
    entry always stays, also when the scaled logits overflow fp32 (a temperature near 1e-38 makes them inf and the
    probabilities NaN): the row then keeps its largest logit, the limit of a vanishing temperature.
    """
    vocab = logits.shape[1]
    sorted_logits = logits.sort(dim=-1, descending=True).values
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    ranks = torch.arange(vocab, device=logits.device)
    in_top_k = ranks[None, :] < k[:, None]
    t = torch.where(temperatures == 0, 1.0, temperatures).to(torch.float32)
    scaled = (sorted_logits / t[:, None]).masked_fill(~in_top_k, float("-inf"))
    probs = scaled.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    keep = in_top_k & ((mass_before < top_p[:, None]) | (ranks == 0)[None, :])
    cutoff = sorted_logits.gather(1, (keep.sum(dim=-1, keepdim=True) - 1))
    return logits.masked_fill(logits < cutoff, float("-inf"))


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of one step, on the logits' device."""

    temperatures: torch.Tensor  # float64 [R], 0 = greedy
    top_k: torch.Tensor  # int64 [R], -1 = off
    top_p: torch.Tensor  # float32 [R], 1 = off
    seeds: torch.Tensor  # int64 [R]
    positions: torch.Tensor  # int64 [R]: index of the output token being sampled
    needs_filter: bool  # some row uses top-k or top-p (known on the host, so no device read decides it)

    @classmethod
    def build(
        cls,
        temperatures: list[float],
        top_k: list[int],
        top_p: list[float],
        seeds: list[int],
        positions: list[int],
        device: torch.device | str,
    ) -> "SamplingBatch":
        return cls(
            temperatures=host_to_device(temperatures, torch.float64, device),
            top_k=host_to_device(top_k, torch.int64, device),
            top_p=host_to_device(top_p, torch.float32, device),
            seeds=host_to_device(seeds, torch.int64, device),
            positions=host_to_device(positions, torch.int64, device),
            needs_filter=any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p),
        )


def sample(logits: torch.Tensor, batch: SamplingBatch, use_triton: bool | None = None) -> torch.Tensor:
    """Draw one token per row. logits fp32 [R, V] -> int64 [R] on the same device, without a host sync.

    use_triton: None picks the Triton kernel on CUDA and the torch reference elsewhere.
    """
    if batch.needs_filter:
        logits = apply_top_k_top_p(logits, batch.temperatures, batch.top_k, batch.top_p)
    keys = sample_keys(batch.seeds, batch.positions)
    if use_triton is None:
        use_triton = logits.is_cuda
    if use_triton:
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        return gumbel_argmax_triton(logits.contiguous(), batch.temperatures, keys, out)
    return gumbel_argmax_torch(logits, batch.temperatures, keys)
