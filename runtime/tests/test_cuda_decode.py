"""On CUDA: the model forward syncs with the host nowhere, and decode replayed from CUDA graphs equals eager decode.

- Sync guard: a batched prefill step and a decode step of the tiny model run under
  torch.cuda.set_sync_debug_mode("error") around the forward only (its StepTensors are made before, as the runner
  does). Any .item() / .tolist() / nonzero / blocking copy between host and device inside raises. The logits must
  equal those of the same step run unguarded on an identical cache.
- Graphs: DecodeGraphs (worker/cuda_graphs.py) against eager decode_forward on copies of one prefilled cache, over
  several decode steps. A padded batch (3 -> 4, 5 -> 8, 13 -> 16 rows) equals the eager step on the same padded
  rows bit for bit (the capture is exact) and the unpadded eager step bit for bit too: measured on H200
  (2026-11-30), the kernels compute a row the same way whatever the row count within a bucket (mini-deepgemm's
  tile sizes change at 16 / 32 / 64 rows, the bucket edges). Every slot and block the batch does not own is left
  exactly as it was; a batch whose size is a bucket leaves its own slots and blocks as the eager step does.
- Through the engine: greedy outputs and logits with graphs equal those with enforce_eager (measured: identical).
- A capture succeeds when the cyclic collector runs during it while a dead DecodeGraphs with captured graphs sits in
  a reference cycle (DecodeGraphs collects before capturing and captures with the collector off).
"""

from __future__ import annotations

import copy

import pytest
import torch

from mini_deepinfer.models.deepseek_v41.cache import BLOCK_SIZE, V41Cache
from mini_deepinfer.worker.cuda_graphs import DecodeGraphs
from mini_deepinfer.worker.forward_batch import ForwardBatch, StepTensors

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CUDA = torch.device("cuda")
WIDTH = 4  # block-table columns of every decode step (512 tokens)
MAX_SEQS = 18  # slots 1..18: the largest batch (16) leaves two slots it must not touch


@pytest.fixture(scope="module")
def model():
    from mini_deepinfer.models.deepseek_v41 import load_model

    return load_model("tiny-random/deepseek-v4.1-flash-1017", "cuda")


def prompts(model, n: int, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, model.config.vocab_size, (20 + 17 * i,), generator=g).tolist() for i in range(n)]


def prefill_batch(toks: list[list[int]], first_slot: int = 1) -> ForwardBatch:
    lens = [len(t) for t in toks]
    tables = [[1 + WIDTH * (first_slot - 1 + i) + j for j in range(WIDTH)] for i in range(len(toks))]
    return ForwardBatch(torch.tensor([x for t in toks for x in t], device=CUDA), lens, [0] * len(lens), tables,
                        [first_slot + i for i in range(len(toks))], [sum(lens[: i + 1]) - 1 for i in range(len(lens))])


def decode_batch(tokens: list[int], positions: list[int], rows: list[int]) -> ForwardBatch:
    """Sequences `rows` (slot r + 1, the tables prefill_batch gave them) adding `tokens` at `positions`."""
    tables = [[1 + WIDTH * r + j for j in range(WIDTH)] for r in rows]
    batch = ForwardBatch(torch.tensor(tokens, device=CUDA), [1] * len(rows), positions, tables, [r + 1 for r in rows],
                         list(range(len(rows))))
    batch.tensors = StepTensors.build(batch, CUDA, WIDTH)
    return batch


def fresh_cache(model) -> V41Cache:
    return V41Cache(model.config, 1 + WIDTH * MAX_SEQS, 1 + MAX_SEQS, "cuda")


def cache_tensors(cache: V41Cache) -> dict[str, torch.Tensor]:
    out = {"engram_history": cache.engram_history}
    for name in ("window", "compressed_kv", "index_k", "comp_kv_state", "comp_score_state"):
        out.update({f"{name}[{lid}]": t for lid, t in getattr(cache, name).items()})
    return out


def rows_of(name: str, model, slots: list[int], blocks: list[int]) -> torch.Tensor:
    """Row indices of cache tensor `name` that belong to the given slots / blocks."""
    W = model.config.sliding_window
    if name.startswith("window"):
        rows = [s * W + i for s in slots for i in range(W)]
    elif name.startswith(("compressed_kv", "index_k")):
        epb = BLOCK_SIZE // model.roles[int(name.split("[")[1][:-1])].ratio
        rows = [b * epb + i for b in blocks for i in range(epb)]
    else:
        rows = slots
    return torch.tensor(rows, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------- sync guard
def guarded(fn):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_forward_has_no_host_sync(model):
    toks = prompts(model, 3)
    caches = [fresh_cache(model), fresh_cache(model)]
    out = []
    for i, cache in enumerate(caches):  # the first run compiles every kernel (Triton may sync while it does)
        with torch.inference_mode():
            pre = prefill_batch(toks)
            pre.tensors = StepTensors.build(pre, CUDA, WIDTH)
            run = lambda: model(pre, cache)  # noqa: E731
            prefill_logits = guarded(run) if i else run()
            dec = decode_batch([5, 6, 7], [len(t) for t in toks], [0, 1, 2])
            assert dec.is_decode and model.decode_ready(dec.slots, cache)
            run = lambda: model(dec, cache)  # noqa: E731
            decode_logits = guarded(run) if i else run()
            out.append((prefill_logits.clone(), decode_logits.clone()))
    for what, a, b in zip(("prefill", "decode"), out[0], out[1]):
        print(f"\n[sync guard] {what}: max |guarded - unguarded| = {float((a - b).abs().max()):.3g}")
        assert torch.equal(a, b), what


# ---------------------------------------------------------------------------------------------- graphs
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 16])
def test_graph_decode_matches_eager(model, n):
    toks = prompts(model, n, seed=n)
    base = fresh_cache(model)
    with torch.inference_mode():
        model(prefill_batch(toks), base)
    eager, graphed, eager_padded = (copy.deepcopy(base) for _ in range(3))
    graphs = DecodeGraphs(model, graphed, CUDA, WIDTH, (1, 2, 4, 8, 16))
    size = graphs.bucket(n)
    rows = list(range(n))
    positions = [len(t) for t in toks]
    tokens = [t[-1] for t in toks]
    others_slots = [s for s in range(1, 1 + MAX_SEQS) if s - 1 not in rows]
    others_blocks = [1 + WIDTH * (s - 1) + j for s in others_slots for j in range(WIDTH)]
    before = {k: v.clone() for k, v in cache_tensors(base).items()}
    worst = 0.0
    for step in range(3):  # positions p, p+1, p+2: ratio-2 groups both close and stay open
        with torch.inference_mode():
            batch = decode_batch(tokens, [p + step for p in positions], rows)
            want = model(batch, eager)
            got = graphs.run(decode_batch(tokens, [p + step for p in positions], rows)).clone()
            model.after_decode(batch.slots, graphed)
            pad = size - n  # the same padded inputs, eagerly
            padded = ForwardBatch(torch.tensor(tokens + [0] * pad, device=CUDA), [1] * size,
                                  [p + step for p in positions] + [0] * pad,
                                  batch.block_tables + [[]] * pad, batch.slots + [0] * pad, list(range(size)))
            padded.tensors = StepTensors.build(padded, CUDA, WIDTH)
            want_padded = model.decode_forward(padded.input_ids, padded.tensors, eager_padded)[:n]
            model.after_decode(batch.slots, eager_padded)
        assert torch.equal(got, want_padded), f"n={n} step {step}: graph != eager on the same padded rows"
        worst = max(worst, float((got - want).abs().max()))
        assert torch.equal(got, want), f"n={n} step {step}: graph != unpadded eager, max diff {worst}"
        tokens = want.argmax(-1).tolist()
    print(f"\n[cuda graphs] n={n} (graph of {size}): max |graph - eager| = {worst:.3g}")
    graph_state, eager_state = cache_tensors(graphed), cache_tensors(eager)
    for name, t in graph_state.items():
        keep = rows_of(name, model, others_slots, others_blocks).to(t.device)
        assert torch.equal(t[keep], before[name][keep]), f"{name}: a slot or block outside the batch changed"
        if size == n:
            mine = rows_of(name, model, [r + 1 for r in rows], [1 + WIDTH * r + j for r in rows for j in range(WIDTH)])
            assert torch.equal(t[mine.to(t.device)], eager_state[name][mine.to(t.device)]), name


def test_a_capture_is_not_where_a_dead_engines_graphs_are_freed(model):
    """A DecodeGraphs with a captured graph dropped inside a reference cycle (as the engine tests drop their
    engines), then another capture during which the cyclic collector runs (forced here, at the first forward under
    capture): the dead graphs must be gone before the capture begins, not reset while a stream captures, which fails
    the capture (cuda_graphs.py's docstring)."""
    import gc

    class CollectingWhileCapturing:
        def __init__(self, inner):
            self.inner = inner

        def decode_forward(self, *args):
            if torch.cuda.is_current_stream_capturing():
                gc.collect()
            return self.inner.decode_forward(*args)

    collecting = gc.isenabled()
    gc.disable()  # the dead graphs go only where a collection is asked for
    try:
        dead = DecodeGraphs(model, fresh_cache(model), CUDA, WIDTH, batch_sizes=(1,))
        dead.graphs[1] = dead._capture(1)
        dead.cycle = dead
        del dead
        live = DecodeGraphs(CollectingWhileCapturing(model), fresh_cache(model), CUDA, WIDTH, batch_sizes=(1,))
        live.graphs[1] = live._capture(1)
    finally:
        if collecting:
            gc.enable()
    live.graphs[1].graph.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("prompts,max_seqs,bucket", [(5, 8, 8), (70, 96, 96)])  # 70 rows: the masked MoE past 64
def test_engine_greedy_tokens_with_and_without_graphs(prompts, max_seqs, bucket):
    from mini_deepinfer import LLM, SamplingParams

    outs = {}
    for eager in (False, True):
        llm = LLM("tiny-random/deepseek-v4.1-flash-1017", max_model_len=512, max_num_seqs=max_seqs,
                  kv_cache_memory_gb=0.5, device="cuda", enforce_eager=eager, record_logits=True)
        g = torch.Generator().manual_seed(11)
        ps = [torch.randint(3, 1000, (30 + (41 * i) % 400,), generator=g).tolist() for i in range(prompts)]
        res = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
        outs[eager] = res
        if not eager:
            assert llm.engine.runner.graphs is not None and bucket in llm.engine.runner.graphs.graphs
        else:
            assert llm.engine.runner.graphs is None
    # Graph replay runs the same fixed-shape decode forward as eager mode: measured bit-identical on H200
    # (2026-11-30). The bound is fixed (not derived from the measured difference, which would let wrong logits
    # excuse themselves) and leaves room only for kernel choices that differ with the batch.
    bound = 2e-2
    worst = 0.0
    for a, b in zip(outs[False], outs[True]):
        for j, (la, lb) in enumerate(zip(a.logits, b.logits)):
            diff = float((la - lb).abs().max())
            worst = max(worst, diff)
            assert diff <= bound, f"{a.request_id} token {j}: graph logits differ from eager by {diff:.3g}"
            top2 = lb.topk(2).values
            if float(top2[0] - top2[1]) < 2 * bound:
                break  # a near tie: later tokens may legitimately differ
            assert a.token_ids[j] == b.token_ids[j], f"{a.request_id} token {j}"
    print(f"\n[cuda graphs] engine, {prompts} prompts x 12 greedy tokens: max |graph - eager| logits = {worst:.3g}")
