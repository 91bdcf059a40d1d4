"""The EP x DP correctness check, shared by the CPU test (gloo, forked ranks) and the 2-GPU run (torchrun, NCCL).

Every rank runs its own batches through ExpertParallelV41Model (experts and Engram rows sharded over the group)
and through a single-process V41Model holding all weights (the oracle) with its own cache, and compares:
- Engram rows gathered across ranks equal the table's rows bit for bit (ragged counts, one rank empty);
- the one-combine EP MoE is within the documented rounding bound of ops.moe: |ep - ref| <= 1.01 * 2^-6 * S per
  element, S = sum_k |y_k| + |shared| (two extra bf16 roundings of the routed part and one final rounding in
  each of ep and ref, u = 2^-8 each); the exact_moe MoE equals ops.moe bit for bit;
- the model forward over a multi-step schedule (prefills of different lengths, decodes, idle steps on either
  rank), in both MoE modes: max |logits - oracle| and whether the greedy tokens agree. The callers assert what
  their platform guarantees (CPU: exact_moe bit-identical; the one-combine mode is measured, not asserted,
  because the tiny random model amplifies one bf16 rounding into logit differences above 1).

    torchrun --nproc-per-node 2 -m mini_deepinfer.distributed.testing --device cuda --backend nvshmem --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from mini_deepep import Buffer

from mini_deepinfer.distributed import init_torchrun_process_group
from mini_deepinfer.models.deepseek_v41 import load_checkpoint, load_token_map, ops, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.cache import V41Cache
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.models.deepseek_v41.parallel import ExpertParallelV41Model
from mini_deepinfer.worker.forward_batch import ForwardBatch

LOGITS_ATOL = 0.05  # the engine-vs-reference tolerance of the project's integration tests
MOE_BOUND = 1.01 * 2**-6
MAX_TOKENS_PER_RANK = 256

# Per step, the sequences each rank runs (by rank parity); a sequence's first step is its whole-prompt prefill,
# later steps decode one token. Ranks idle in different steps; prompt lengths cross the 128-token window/block.
PROMPTS = {"A": 150, "B": 37, "C": 60}
SCHEDULE = (
    (("A", "B"), ("A", "B"), ("A", "B"), ("A",), ()),
    ((), ("C",), ("C",), ("C",), ("C",)),
)


def moe_error_ratio(ep_out: torch.Tensor, v: torch.Tensor, w: dict, p: str, cfg) -> float:
    """max |ep - ops.moe| / (MOE_BOUND * S), S = sum over the token's routed outputs and shared output of |y|."""
    ref = ops.moe(v, w, p, cfg)
    idx, wt = ops.moe_route(v, w, p, cfg)
    magnitude = ops.swiglu_expert(v, w, f"{p}.shared_experts", cfg).float().abs()
    for e in torch.unique(idx).tolist():
        rows, slot = (idx == e).nonzero(as_tuple=True)
        y = ops.swiglu_expert(v[rows], w, f"{p}.experts.{e}", cfg, wt[rows, slot])
        magnitude.index_add_(0, rows, y.float().abs())
    err = (ep_out.float() - ref.float()).abs()
    return float((err / (MOE_BOUND * magnitude).clamp_min(1e-30)).max()) if err.numel() else 0.0


def check_engram_rows(ep: ExpertParallelV41Model, oracle: V41Model, rank: int) -> bool:
    exact = True
    cfg = ep.config
    for counts in ((50, 0), (3, 17)):
        for lid, n in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
            p = f"layers.{lid}.engram"
            g = torch.Generator().manual_seed(1000 * lid + rank)
            ids = torch.randint(0, n, (counts[rank % 2],), generator=g)
            ids[: 3] = torch.tensor([0, n - 1, ep.engram_rows[p].stop % n])[: ids.numel()]  # ends and split edge
            ids = ids.to(ep.device)
            table, scale = ep.gather_table_rows(ids, p)
            exact &= torch.equal(table.view(torch.uint8), oracle.w[f"{p}.embed.weight"].view(torch.uint8)[ids])
            exact &= torch.equal(scale.view(torch.uint8), oracle.w[f"{p}.embed.scale"].view(torch.uint8)[ids])
    return bool(exact)


def check_moe(ep: ExpertParallelV41Model, oracle: V41Model, rank: int) -> tuple[float, bool]:
    """(worst error / bound of the one-combine MoE, whether the exact_moe output equals ops.moe bit for bit)."""
    worst, identical = 0.0, True
    for counts in ((33, 0), (5, 64)):
        g = torch.Generator().manual_seed(7 + rank)
        v = torch.randn(counts[rank % 2], ep.config.hidden_size, generator=g).to(ep.device, torch.bfloat16)
        for lid in (0, ep.config.num_hidden_layers - 1):
            p = f"layers.{lid}.ffn"
            ep.exact_moe = False
            worst = max(worst, moe_error_ratio(ep._moe(v, p), v, oracle.w, p, ep.config))
            ep.exact_moe = True
            identical &= torch.equal(ep._moe(v, p), ops.moe(v, oracle.w, p, ep.config))
    return worst, bool(identical)


def run_schedule(ep: ExpertParallelV41Model, oracle: V41Model, rank: int) -> dict:
    cfg, device = ep.config, ep.device
    caches = [V41Cache(cfg, 8, 4, device) for _ in range(2)]
    g = torch.Generator().manual_seed(100 + rank)
    tokens = {name: torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for name, n in PROMPTS.items()}
    slots, blocks, cached = {"A": 1, "B": 2, "C": 1}, {"A": [1, 2], "B": [3], "C": [4]}, {n: 0 for n in PROMPTS}
    max_diff, same_tokens, steps = 0.0, True, []
    for names in SCHEDULE[rank % 2]:
        query = [tokens[n][cached[n]:] for n in names]
        batch = ForwardBatch(
            input_ids=torch.tensor([t for q in query for t in q], dtype=torch.int64, device=device),
            query_lens=[len(q) for q in query], context_lens=[cached[n] for n in names],
            block_tables=[blocks[n] for n in names], slots=[slots[n] for n in names],
            sample_rows=[sum(len(q) for q in query[: i + 1]) - 1 for i in range(len(names))])
        logits = ep(batch, caches[0])
        ref = oracle(batch, caches[1]) if names else logits
        if names:
            max_diff = max(max_diff, float((logits - ref).abs().max()))
            same_tokens &= torch.equal(logits.argmax(-1), ref.argmax(-1))
        for n, q, t in zip(names, query, logits.argmax(-1).tolist()):
            cached[n] += len(q)
            tokens[n].append(t)
        steps.append({"sequences": list(names), "tokens": batch.num_tokens})
    return {"logits_max_abs_diff": max_diff, "greedy_tokens_equal": bool(same_tokens), "steps": steps}


def ep_check(device: torch.device, backend: str) -> dict:
    """Run every check on this rank (the process group is initialised); returns its measurements."""
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = resolve_checkpoint("tiny")
    cfg, weights = load_checkpoint(folder)
    token_map = load_token_map(folder, cfg)
    num_nvl_bytes = 0
    if device.type == "cuda" and backend != "torch":
        num_nvl_bytes = Buffer.get_nvl_buffer_size_hint(MAX_TOKENS_PER_RANK, cfg.hidden_size, cfg.num_experts_per_tok,
                                                        world)
    with Buffer(None, num_nvl_bytes, backend=backend) as buffer:
        ep = ExpertParallelV41Model(cfg, weights, buffer, device, token_map)
        oracle = V41Model(cfg, weights, device, token_map)
        moe_ratio, moe_identical = check_moe(ep, oracle, rank)
        result = {
            "rank": rank, "world_size": world, "device": str(device), "buffer_backend": buffer.backend_name,
            "local_experts": [ep.local_experts.start, ep.local_experts.stop],
            "engram_rows_exact": check_engram_rows(ep, oracle, rank),
            "moe_error_over_bound": moe_ratio,
            "moe_exact_bit_identical": moe_identical,
        }
        for exact in (True, False):
            ep.exact_moe = exact
            result["schedule_exact_moe" if exact else "schedule_one_combine"] = run_schedule(ep, oracle, rank)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return result


def _forked_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    # the ranks share the machine's cores; and a forked rank with several threads deadlocks in the parent's OpenMP pool
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = ep_check(torch.device("cpu"), "torch")
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_cpu_ranks(world: int, out_dir: str) -> list[dict]:
    """Run ep_check on `world` forked CPU processes over gloo; returns each rank's result."""
    import torch.multiprocessing as mp
    from mini_deepep.testing import free_port

    mp.start_processes(_forked_rank, args=(world, free_port(), out_dir), nprocs=world, start_method="fork")
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    """torchrun entry point: one rank per process, NCCL on CUDA (one GPU each) or gloo on CPU."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backend", default="auto", choices=["auto", "nvshmem", "torch"])
    parser.add_argument("--out", required=True, help="folder for rank<r>.json")
    args = parser.parse_args()
    device = init_torchrun_process_group(args.device)
    try:
        result = ep_check(device, args.backend)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"rank{dist.get_rank()}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
