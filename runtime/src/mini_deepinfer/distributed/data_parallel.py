"""Data parallelism over engines: one LLMEngine per rank, each with its own requests, scheduler, cache and batch.

The model of every rank is an ExpertParallelV41Model, whose forward is collective, so the ranks step in lockstep
and agree on each step before running it (host-side votes on a gloo group: booleans, no device sync):

    vote 1  does any rank want a prefill (waiting sequences, and its prefill interval says try)?
            if so, every rank admits what it can (possibly nothing);
    vote 2  did any rank admit something? then this is a prefill step everywhere; a rank that admitted nothing
            runs a dummy forward instead of its decodes (every rank runs the same phase);
    vote 3  otherwise every rank schedules its decodes: does any rank have one? then the ranks without one run a
            dummy forward.

Vote 2 is the official engine's post-admission vote: without it a rank that passed vote 1 but could admit nothing
(budget, blocks) would make the whole fleet run an empty prefill step. Vote 1 here is a plain ANY; the official
engine alternates ALL and ANY points on a schedule, which is not reproduced. A step in which no rank has work is
empty everywhere, and the engine's no-progress check applies as in a single process.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from mini_deepinfer.engine.block_manager import KVCacheManager
from mini_deepinfer.engine.llm_engine import EngineConfig, LLMEngine, RequestOutput
from mini_deepinfer.engine.sampling_params import SamplingParams
from mini_deepinfer.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from mini_deepinfer.worker.forward_batch import ForwardBatch


def vote_any(flag: bool, group: dist.ProcessGroup | None) -> bool:
    """True if `flag` is true on any rank of `group` (a CPU group: no device sync). Collective."""
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, dist.ReduceOp.MAX, group=group)
    return bool(t.item())


class DataParallelScheduler(Scheduler):
    """The single-process scheduler plus the fleet's votes (module docstring). `fleet_busy` says, after
    `schedule()`, whether some rank runs a forward in this step."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, group: dist.ProcessGroup | None) -> None:
        super().__init__(config, kv)
        self.group = group
        self.fleet_busy = False

    def schedule(self) -> ScheduledStep:
        if vote_any(bool(self.waiting) and self._should_attempt_prefill(), self.group):  # vote 1
            step = self._schedule_prefill()
            if vote_any(not step.is_empty, self.group):  # vote 2
                self.decode_steps_since_prefill = 0  # on every rank, so the prefill intervals stay aligned
                self.fleet_busy = True
                return step
        step = self._schedule_decode()
        if not step.is_empty:
            self.decode_steps_since_prefill += 1
        self.fleet_busy = vote_any(not step.is_empty, self.group)  # vote 3
        return step


class DataParallelLLMEngine(LLMEngine):
    """One rank's engine. Every rank calls `has_unfinished_requests()` and `step()` in the same loop (both are
    collective), each with its own requests: `while engine.has_unfinished_requests(): engine.step()`.

    vote_group: a gloo group of the data-parallel ranks (None = WORLD when WORLD is gloo).
    """

    def __init__(self, model: torch.nn.Module, cache_cls, config: EngineConfig, device: torch.device | str,
                 vote_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(model, cache_cls, config, device)
        self.scheduler = DataParallelScheduler(self.scheduler.config, self.scheduler.kv, vote_group)
        self.vote_group = vote_group

    def has_unfinished_requests(self) -> bool:
        """True while any rank has work (a rank that is done keeps stepping, idle, until all are)."""
        return vote_any(super().has_unfinished_requests(), self.vote_group)

    def _join_peers_step(self) -> bool:
        if not self.scheduler.fleet_busy:
            return False
        empty = ForwardBatch(torch.empty(0, dtype=torch.int64, device=self.device), [], [], [], [], [])
        with torch.inference_mode():
            self.runner.model(empty, self.runner.cache)
        return True


# ---------------------------------------------------------------------------------------------- launcher
def _rank_generate(rank: int, world: int, port: int, model: str, prompts: list[list[int]],
                   params: list[SamplingParams], device_type: str, engine_kwargs: dict, exact_moe: bool,
                   out_dir: str) -> None:
    from mini_deepep import Buffer

    from mini_deepinfer.models.deepseek_v41 import load_checkpoint, load_token_map, resolve_checkpoint
    from mini_deepinfer.models.deepseek_v41.cache import V41Cache
    from mini_deepinfer.models.deepseek_v41.parallel import ExpertParallelV41Model

    on_gpu = device_type == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the machine's cores
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, **({"device_id": device} if on_gpu else {}))
    vote_group = dist.new_group(backend="gloo") if on_gpu else None
    try:
        folder = resolve_checkpoint(model)
        cfg, weights = load_checkpoint(folder)
        config = EngineConfig(**engine_kwargs)
        nvl_bytes = 0
        if on_gpu:  # room for a whole step's tokens of every rank
            nvl_bytes = Buffer.get_nvl_buffer_size_hint(config.scheduler_config().max_num_batched_tokens,
                                                        cfg.hidden_size, cfg.num_experts_per_tok, world)
        with Buffer(None, nvl_bytes) as buffer:
            ep_model = ExpertParallelV41Model(cfg, weights, buffer, device, load_token_map(folder, cfg),
                                              exact_moe=exact_moe)
            engine = DataParallelLLMEngine(ep_model, V41Cache, config, device, vote_group)
            mine = range(rank, len(prompts), world)  # round-robin share of the prompts
            for i in mine:
                engine.add_request(prompts[i], params[i], request_id=f"p{i}")
            outputs = {}
            while engine.has_unfinished_requests():
                for out in engine.step():
                    outputs[out.request_id] = out
            if on_gpu:
                torch.cuda.synchronize()
        torch.save([outputs[f"p{i}"] for i in mine], Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def generate_data_parallel(model: str, prompts: list[list[int]], sampling_params: SamplingParams | list[SamplingParams],
                           data_parallel_size: int, device: str = "cpu", exact_moe: bool = False,
                           **engine_kwargs) -> list[RequestOutput]:
    """Generate on `data_parallel_size` processes (EP x DP): one GPU each (NCCL, mini-deepep's NVSHMEM backend
    when available) or CPU processes over gloo. Prompt i goes to rank i % N; outputs come back in prompt order.

    model: a checkpoint folder or known name; engine_kwargs: EngineConfig fields (on CPU give kv_cache_memory_gb).
    """
    import torch.multiprocessing as mp
    from mini_deepep.testing import free_port

    from mini_deepinfer.models.deepseek_v41 import resolve_checkpoint

    resolve_checkpoint(model)  # a generated checkpoint is made once here, not raced for by the ranks
    params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    with tempfile.TemporaryDirectory() as out_dir:
        # Spawned, on CPU too: a forked rank inherits the parent's OpenMP thread pool in a state it cannot use, and
        # its first multi-threaded op deadlocked wherever a rank gets more than one thread (any machine of 4 or more
        # cores; session 22, the GPU machine's 16). CUDA cannot be forked either.
        mp.start_processes(
            _rank_generate, args=(data_parallel_size, free_port(), model, prompts, params, device, engine_kwargs,
                                  exact_moe, out_dir),
            nprocs=data_parallel_size, start_method="spawn")
        per_rank = [torch.load(Path(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(data_parallel_size)]
    return [per_rank[i % data_parallel_size][i // data_parallel_size] for i in range(len(prompts))]
