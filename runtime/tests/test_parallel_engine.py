"""Data-parallel engines: two gloo ranks, each its own LLMEngine and requests, against one single-process engine.

Rank r serves prompts r, r + 2, ...; the prompt lengths and output lengths differ per rank, so the ranks prefill
in different steps and one finishes early and idles (dummy forwards) while the other decodes. With exact_moe the
EP model is bit-identical to V41Model row by row, so the metric is: the same tokens (greedy and seeded sampling)
and logits within 0.05 of the single-process engine's (the max is printed; batch composition differs between the
runs, so bit-identity is not claimed).
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import random
import threading
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mini_deepep.testing import free_port

from mini_deepinfer.distributed.data_parallel import DataParallelLLMEngine, generate_data_parallel
from mini_deepinfer.engine.llm_engine import EngineConfig
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.testing import FakeConfig, FakePagedCache, FakePagedModel, fake_generate
from mini_deepinfer.entrypoints.llm import LLM

ENGINE = {"max_model_len": 256, "max_num_seqs": 4, "kv_cache_memory_gb": 0.05, "record_logits": True}


def _kill_hung_ranks() -> None:
    """The test process's stacks to stderr and its rank processes killed: the join then raises and the test fails
    with its report instead of hanging until CI's time limit."""
    faulthandler.dump_traceback(all_threads=True)
    for child in multiprocessing.active_children():
        child.kill()


def test_two_data_parallel_ranks_match_single_process_engine(monkeypatch) -> None:
    rng = random.Random(3)
    lengths, max_tokens = [150, 25, 40, 12], [5, 2, 4, 1]
    prompts = [[rng.randrange(3, 129280) for _ in range(n)] for n in lengths]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    params[2] = SamplingParams(temperature=0.8, top_k=50, max_tokens=4, ignore_eos=True, seq_seed=5)
    # Ranks forked from a process whose OpenMP pool had run deadlocked in their first multi-threaded op wherever a
    # rank got several threads (cpu_count // ranks: a machine of 4 or more cores; session 22, on the GPU machine).
    # The same conditions on any machine: the parent's pool runs with 2 threads, and os.cpu_count, which a forked
    # rank would inherit patched, says 4. A regression hangs: after 300 s the watchdog kills the ranks and it fails.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.arange(1 << 20).sum()
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    watchdog = threading.Timer(300, _kill_hung_ranks)
    watchdog.start()
    try:
        dp = generate_data_parallel("tiny", prompts, params, 2, exact_moe=True, **ENGINE)
    finally:
        watchdog.cancel()
        monkeypatch.undo()
        torch.set_num_threads(threads)
    single = LLM("tiny", device="cpu", **ENGINE).generate(prompts, params, use_tqdm=False)
    worst = 0.0
    for i, (got, want) in enumerate(zip(dp, single)):
        assert got.token_ids == want.token_ids, i
        assert len(got.logits) == len(want.logits) == max_tokens[i]
        worst = max([worst] + [float((a - b).abs().max()) for a, b in zip(got.logits, want.logits)])
    print(f"data-parallel vs single-process engine: logits max |diff| {worst:.3g}")
    assert worst <= 0.05


# ------------------------------------------------------------------------------ the votes, on the fake model
FAKE = FakeConfig(vocab_size=512, eos_token_id=1)


class PhaseRecorder(torch.nn.Module):
    """Wraps the fake model and records each forward's phase: "prefill", "decode" or "idle" (empty batch)."""

    def __init__(self, inner: FakePagedModel) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config
        self.phases: list[str] = []

    def forward(self, batch, cache) -> torch.Tensor:
        if batch.num_tokens == 0:
            self.phases.append("idle")
            return torch.empty(0, self.config.vocab_size)
        decode = all(q == 1 and c > 0 for q, c in zip(batch.query_lens, batch.context_lens))
        self.phases.append("decode" if decode else "prefill")
        return self.inner(batch, cache)


def _fake_workload(rank: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(rank)
    if rank == 0:  # a long prompt (chunked over three steps) arriving with two short ones
        return [([rng.randrange(2, 512) for _ in range(n)], SamplingParams(temperature=0.0, max_tokens=m,
                                                                         ignore_eos=True))
                for n, m in ((37, 12), (300, 6), (129, 14))]
    return [([rng.randrange(2, 512) for _ in range(20)],
             SamplingParams(temperature=0.9, top_p=0.9, max_tokens=40, seq_seed=9, ignore_eos=True))]


def _fake_rank(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # a forked rank with several threads deadlocks in the parent's OpenMP pool
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = PhaseRecorder(FakePagedModel(FAKE))
        config = EngineConfig(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=128,
                              prefill_attempt_interval=3, record_logits=True,
                              kv_cache_memory_gb=(64 * FakePagedCache.bytes_per_block(FAKE) + 5 * 16) / 2**30)
        engine = DataParallelLLMEngine(model, FakePagedCache, config, "cpu")
        requests = _fake_workload(rank)
        for i, (prompt, sp) in enumerate(requests):
            engine.add_request(prompt, sp, request_id=f"r{i}")
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out
        same = all(outputs[f"r{i}"].token_ids == fake_generate(p, sp, sp.seq_seed or 0, FAKE, 512)[0]
                   for i, (p, sp) in enumerate(requests))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"phases": model.phases, "tokens_equal": same}))
    finally:
        dist.destroy_process_group()


def test_ranks_run_the_same_phase_every_step_and_idle_ranks_join(tmp_path) -> None:
    mp.start_processes(_fake_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["tokens_equal"] for r in ranks)
    phases = [r["phases"] for r in ranks]
    assert len(phases[0]) == len(phases[1]), "every rank runs one forward per fleet step"
    for step, pair in enumerate(zip(*phases)):
        busy = {p for p in pair if p != "idle"}
        assert len(busy) == 1, (step, pair)  # one phase per step, and never an all-idle step
    assert "idle" in phases[0] and "idle" in phases[1]  # both ranks waited for the other at some point
