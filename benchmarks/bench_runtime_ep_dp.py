"""EP x DP layer timings of the V4.1 runtime: the MoE layer single-process (V41Model._moe: the engine's grouped MoE,
the oracle the EP override is tested against) vs over the EP group (one combine, and exact_moe's num_topk combines),
and the Engram row gather, per rank-local token count. Launch with torchrun:

    torchrun --nproc-per-node 2 benchmarks/bench_runtime_ep_dp.py --device cuda --out DIR   # NCCL + NVSHMEM
    torchrun --nproc-per-node 2 benchmarks/bench_runtime_ep_dp.py --device cpu --out DIR    # gloo

Every rank runs the same token count; times are per call, the mean of --iters after --warmup calls, measured on
rank 0 between barriers (CUDA: synchronised). Writes DIR/bench_runtime_ep_dp.json with hardware and versions.
Until session 45 the single-process figure timed ops.moe, the per-expert loop with a host read of the counts
(docs/reports/data/runtime-ep-dp-cpu.json); on CUDA that loop now also reads each expert's weights back from the
FP8-MMA route's order (ops.KernelWeights), so it is no longer a fair baseline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist
from mini_deepep import Buffer

from mini_deepinfer.distributed import init_torchrun_process_group
from mini_deepinfer.models.deepseek_v41 import load_checkpoint, load_token_map, resolve_checkpoint
from mini_deepinfer.models.deepseek_v41.model import V41Model
from mini_deepinfer.models.deepseek_v41.parallel import ExpertParallelV41Model


def timed_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / iters * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tokens", default="16,64,256,1024")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    device = init_torchrun_process_group(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    token_counts = [int(t) for t in args.tokens.split(",")]
    folder = resolve_checkpoint("tiny")
    cfg, weights = load_checkpoint(folder)
    nvl_bytes = 0
    if device.type == "cuda":
        nvl_bytes = Buffer.get_nvl_buffer_size_hint(max(token_counts), cfg.hidden_size, cfg.num_experts_per_tok, world)
    engram = f"layers.{cfg.engram_layer_ids[0]}.engram"
    rows = []
    with Buffer(None, nvl_bytes) as buffer:
        token_map = load_token_map(folder, cfg)
        ep = ExpertParallelV41Model(cfg, weights, buffer, device, token_map)
        single = V41Model(cfg, weights, device, token_map)
        for T in token_counts:
            gen = torch.Generator().manual_seed(rank)
            v = torch.randn(T, cfg.hidden_size, generator=gen).to(device, torch.bfloat16)
            ids = torch.randint(0, cfg.engram_num_embeddings[0], (T * 12,), generator=gen).to(device)
            row = {"tokens_per_rank": T,
                   "moe_single_process_ms": timed_ms(lambda v=v: single._moe(v, "layers.0.ffn"), device, args.warmup,
                                                     args.iters)}
            for exact in (False, True):
                ep.exact_moe = exact
                key = "moe_ep_exact_ms" if exact else "moe_ep_one_combine_ms"
                row[key] = timed_ms(lambda v=v: ep._moe(v, "layers.0.ffn"), device, args.warmup, args.iters)
            row["engram_gather_ms"] = timed_ms(lambda ids=ids: ep.gather_table_rows(ids, engram), device, args.warmup,
                                               args.iters)
            rows.append(row)
        backend = buffer.backend_name
    if rank == 0:
        meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                or platform.machine(), "cpu_count": os.cpu_count(), "world_size": world, "buffer_backend": backend,
                "torch": torch.__version__, "python": platform.python_version(), "model": "tiny (hidden 128, "
                f"{cfg.n_routed_experts} experts, top-{cfg.num_experts_per_tok})", "warmup": args.warmup,
                "iters": args.iters}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "bench_runtime_ep_dp.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(json.dumps(meta))
        print("tokens/rank | MoE single ms | MoE EP one-combine ms | MoE EP exact ms | Engram gather ms")
        for r in rows:
            print(f"{r['tokens_per_rank']:>11} | {r['moe_single_process_ms']:>13.2f} | {r['moe_ep_one_combine_ms']:>21.2f}"
                  f" | {r['moe_ep_exact_ms']:>15.2f} | {r['engram_gather_ms']:>16.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
