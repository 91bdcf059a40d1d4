"""Checkpoint format on the GPU machine: CUDA loading and in-memory random weights, correctness then timings.

Checks (exact): a generated tiny checkpoint loads bit-identically on CPU and CUDA; build_random_weights on CUDA
is deterministic and has the intended scales (dequantized std x sqrt(fan_in) within 5% of 1).
Times (after one warm-up, torch.cuda.synchronize around each): build_random_weights of the tiny config and of a
3-layer config with the real V4.1 widths on CUDA, writing and loading the tiny checkpoint.
Usage: python3 benchmarks/bench_mini_deepinfer_checkpoint.py [out.json]
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import sys
import tempfile
import time

import torch

from mini_deepgemm.reference import fp4_dequant, weight_dequant_fp8
from mini_deepinfer.models.deepseek_v41.checkpoint import (
    build_random_weights,
    generate_random_checkpoint,
    load_checkpoint,
)
from mini_deepinfer.models.deepseek_v41.config import V41Config, tiny_config


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(_bits(a[n]).cpu(), _bits(b[n]).cpu()) for n in a)


def _timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _nbytes(w: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in w.values())


def main() -> None:
    tiny = tiny_config()
    real3 = dataclasses.replace(V41Config(), num_hidden_layers=3, compress_ratios=(0, 0, 2), kv_source_layer_ids=(2,),
                                index_source_layer_ids=(2,), engram_layer_ids=(), engram_num_embeddings=())
    checks: dict[str, bool] = {}
    rows: list[tuple[str, float, float]] = []  # (what, seconds, GB)

    with tempfile.TemporaryDirectory() as tmp:
        (path, t_gen) = _timed(lambda: generate_random_checkpoint(tiny, f"{tmp}/tiny", seed=1017))
        _, cpu_w = load_checkpoint(path)
        _, t_load = _timed(lambda: load_checkpoint(path, device="cuda"))
        _, cuda_w = load_checkpoint(path, device="cuda")
        checks["load cuda == load cpu (bit-exact)"] = _equal(cpu_w, cuda_w)
        checks["load on cuda puts tensors on cuda:0"] = all(t.device.index == 0 for t in cuda_w.values())
        if torch.cuda.device_count() > 1:
            _, w1 = load_checkpoint(path, device="cuda:1")
            checks["load on cuda:1"] = all(t.device == torch.device("cuda", 1) for t in w1.values())
        rows += [("generate tiny checkpoint (CPU, files)", t_gen, _nbytes(cpu_w) / 1e9),
                 ("load tiny checkpoint -> cuda", t_load, _nbytes(cpu_w) / 1e9)]
    del cpu_w, cuda_w

    build_random_weights(tiny, seed=0, device="cuda")  # warm-up
    a, t_tiny = _timed(lambda: build_random_weights(tiny, seed=0, device="cuda"))
    checks["build on cuda is deterministic"] = _equal(a, build_random_weights(tiny, seed=0, device="cuda"))
    checks["build on cuda: all finite"] = all(bool(torch.isfinite(t.float()).all()) for t in a.values())
    rows.append(("build_random_weights tiny (cuda)", t_tiny, _nbytes(a) / 1e9))
    del a

    w, t_real = _timed(lambda: build_random_weights(real3, seed=0, device="cuda"))
    rows.append(("build_random_weights real widths, 3 layers (cuda)", t_real, _nbytes(w) / 1e9))
    fp8 = weight_dequant_fp8(w["layers.2.attn.wq_b.weight"], w["layers.2.attn.wq_b.scale"])
    fp4 = fp4_dequant(w["layers.2.ffn.experts.7.w2.weight"], w["layers.2.ffn.experts.7.w2.scale"])
    stds = {"wq_b x sqrt(1280)": fp8.std().item() * 1280**0.5, "expert w2 x sqrt(2304)": fp4.std().item() * 2304**0.5,
            "embed": w["embed.weight"].float().std().item()}
    checks["real widths: std x sqrt(fan_in) within 5% of 1"] = all(abs(v - 1) < 0.05 for v in stds.values())
    del w, fp8, fp4

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "checks": checks, "stds": stds,
        "timings": [{"what": w_, "seconds": s, "GB": gb} for w_, s, gb in rows],
    }
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=2)
    print(f"{result['date']}  {result['gpu']} x{result['gpus']}  torch {result['torch']}  python {result['python']}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print("stds: " + ", ".join(f"{k} {v:.4f}" for k, v in stds.items()))
    print(f"{'what':52s} {'s':>8s} {'GB':>8s} {'GB/s':>8s}")
    for w_, s, gb in rows:
        print(f"{w_:52s} {s:8.2f} {gb:8.3f} {gb / s:8.2f}")
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
