"""How far each stage of a measured V4.1-Flash step is from its floor: FLOPs / rate and bytes / bandwidth, per stage.

A CPU-only analysis of committed benchmark results (no GPU run): it reads the per-stage profile of a bench_prefill.py
or bench_decode.py JSON (40-layer equivalents, kernel time per stage) and puts beside each stage the least time any
kernel could take on the same GPU:

    floor = max(FLOPs / matmul rate, bytes / copy bandwidth)

- FLOPs: bench_prefill.layer_flops over the real model's 40 layers (V41Config().layer_roles), split into this
  profile's stages; the MoE gate's 2 T D E leaves "moe" for "moe routing". The head adds 2 x sequences x D x vocab.
  A decode step of batch B at context C is B one-token forwards at C cached tokens each.
- Rates: the FP8 matmul rate measured in the prefill run (cuBLAS per-tensor FP8 at 8192^3) for stages whose matmuls
  run on FP8 MMAs (projections, MoE experts, indexer, Engram); a bf16 rate for the ones on bf16 MMAs (attention over
  the dequantized cache, gate, compressor, head, hc). The bf16 default, 813 TFLOP/s, is the highest bf16 cuBLAS
  8192^3 rate measured in this repo (docs/reports/flashmla-gluon.md); a higher rate only lowers a floor.
- Bytes, the least each stage must move, taken from the checkpoint's own tensor list (checkpoint.expected_tensors):
  - weights, each read once per step. Routed experts: only those some token picks, in expectation under uniform
    independent routing, 1 - (1 - k/E)^tokens of them (a decode batch of 64 touches 64% of 384 experts, a
    4,096-token prefill all). Engram table: only the looked-up rows.
  - activations a stage cannot avoid: each GEMM's FP8 input and bf16 output (for the MoE, each (token, expert)
    pair's; the SwiGLU intermediate between w13 and w2 could stay on chip); the hyper-connection stream read and
    written once per sublayer (its mixes, collapse and expand fused: H [T, 4, D] bf16 in and out, the sublayer's
    input and output [T, D]); each sequence's cache rows its last query attends to or scores (every earlier query's
    rows are among them: a valid lower bound, exact for decode).
- Not estimated (shown as measured only): top-k, window cache, norm, MoE dispatch/combine, other. Their work is
  element-wise or data movement whose least traffic depends on what is fused with what.

Two step floors are reported: the sum of the per-stage floors (stages one after another, as the engine runs them)
and max(all FLOPs / rate, all bytes / bandwidth), reachable only by overlapping compute-bound stages with
memory-bound ones (e.g. two micro-batches).

Usage:
  python3 benchmarks/step_floors.py                               # the session-45 runs (docs/reports/data/s45-*)
  python3 benchmarks/step_floors.py --prefill P.json --decode D.json --copy-json ORDER.json --out floors.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench_prefill import layer_flops
from mini_deepinfer.models.deepseek_v41.checkpoint import expected_tensors
from mini_deepinfer.models.deepseek_v41.config import LayerMode, LayerRole, V41Config
from mini_flashmla.cache_layout import COMPRESSED_KV_ROW_BYTES, INDEX_K_ROW_BYTES, WINDOW_ROW_BYTES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/reports/data"
DEFAULT_PREFILL = DATA / "s45-run2/prefill_new_h200.json"
DEFAULT_DECODE = (DATA / "s45-run2/decode_new_h200.json", DATA / "s45-run3/decode_wide_new_h200.json")
DEFAULT_COPY = DATA / "s45-run2/order_new/exp_moe_weight_order.json"
BF16_TFLOPS = 813.0
SWEEP_TOKENS = (1024, 2048, 4096, 8192, 16384)
EP_SIZES = (1, 2, 4, 8)

FP8_STAGES = ("projections", "moe experts", "indexer", "engram")
ESTIMATED = ("moe experts", "projections", "sparse attention", "indexer", "hc", "engram", "compressor",
             "moe routing", "head")

# checkpoint tensor name (a layer's part after "layers.N.") -> stage; the first pattern that matches wins
WEIGHT_STAGES = (
    (r"ffn\.experts\.", "moe experts (routed)"),
    (r"ffn\.shared_experts\.", "moe experts"),
    (r"ffn\.gate\.", "moe routing"),
    (r"attn\.indexer\.", "indexer"),
    (r"attn\.compressor\.", "compressor"),
    (r"attn\.attn_sink", "sparse attention"),
    (r"attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.", "projections"),
    (r"(attn_norm|ffn_norm|attn\.q_norm|attn\.kv_norm)\.", "norm"),
    (r"hc_", "hc"),
    (r"engram\.embed\.", "engram (table)"),
    (r"engram\.", "engram"),
)
OUTSIDE_STAGES = {"head.weight": "head", "norm.weight": "norm", "embed.weight": "embedding (table)"}


def weight_stage(name: str) -> str:
    """The stage that reads checkpoint tensor `name` ("layers.3.attn.wq_b.weight" -> "projections")."""
    if name in OUTSIDE_STAGES:
        return OUTSIDE_STAGES[name]
    local = re.sub(r"^layers\.\d+\.", "", name)
    for pattern, stage in WEIGHT_STAGES:
        if re.match(pattern, local):
            return stage
    raise ValueError(f"no stage for checkpoint tensor {name!r}")


@functools.cache
def weight_bytes_by_layer(cfg: V41Config) -> tuple[dict[int, dict[str, int]], dict[str, int]]:
    """({layer id: {stage: bytes}}, {stage: bytes} outside the layers): every tensor of expected_tensors once.
    Cached per config (the real model lists ~92k tensors; the sweep and EP tables ask again and again): read only."""
    layers: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    outside: dict[str, int] = defaultdict(int)
    for name, (shape, dtype) in expected_tensors(cfg).items():
        size = math.prod(shape) * dtype.itemsize
        m = re.match(r"layers\.(\d+)\.", name)
        (layers[int(m.group(1))] if m else outside)[weight_stage(name)] += size
    return {lid: dict(stages) for lid, stages in layers.items()}, dict(outside)


def touched_fraction(tokens: int, k: int, experts: int) -> float:
    """Expected fraction of the routed experts that at least one of `tokens` tokens picks (k distinct each),
    under uniform independent routing."""
    return 1.0 - (1.0 - k / experts) ** tokens


def stage_flops(cfg: V41Config, role: LayerRole, tokens: int, cached: int) -> dict[str, int]:
    """layer_flops in this profile's stage names."""
    f = layer_flops(cfg, role, tokens, cached)
    gate = 2 * tokens * cfg.hidden_size * cfg.n_routed_experts
    out = {"hc": f["hc"], "projections": f["projections"], "sparse attention": f["attention"],
           "moe routing": gate, "moe experts": f["moe"] - gate}
    for key in ("compressor", "indexer", "engram"):
        if key in f:
            out[key] = f[key]
    return out


def activation_bytes(cfg: V41Config, role: LayerRole, tokens: int, context: int, sequences: int
                     ) -> dict[str, int]:
    """Least activation and cache bytes one layer's stages move for `sequences` sequences that together add
    `tokens` query tokens, each sequence's last query at position context - 1."""
    D, H, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    T, r = tokens, role.ratio
    qd = H * hd
    gemms = ((D, cfg.q_lora_rank), (cfg.q_lora_rank, qd), (D, hd), (qd, cfg.o_groups * cfg.o_lora_rank),
             (cfg.o_groups * cfg.o_lora_rank, D))  # (K, N) of wq_a, wq_b, wkv, wo_a (all groups), wo_b
    visible = context // r if r else 0
    out = {
        # per sublayer: H [T, hc, D] read and written, the sublayer's input u and output y [T, D], all bf16
        "hc": 2 * 2 * T * D * (2 * cfg.hc_mult + 2),
        "projections": T * sum(k + 2 * n for k, n in gemms),
        # q read, o written (bf16); each sequence's window rows and top-k compressed rows
        "sparse attention": 2 * 2 * T * qd + sequences * (min(context, cfg.sliding_window) * WINDOW_ROW_BYTES
                                                           + min(visible, cfg.index_topk) * COMPRESSED_KV_ROW_BYTES),
        "moe routing": 2 * T * D,
        # FP8 rows in, bf16 rows out for each (token, expert) pair, routed and shared
        "moe experts": 3 * T * D * (cfg.num_experts_per_tok + cfg.n_shared_experts),
    }
    if role.mode == LayerMode.FULL:
        out["compressor"] = 2 * T * D
    if role.mode in (LayerMode.FULL, LayerMode.REINDEX):
        scored = min(visible, cfg.candidate_topk_blocks * cfg.candidate_block_size) if role.uses_candidates \
            else visible
        out["indexer"] = T * (cfg.q_lora_rank + 2 * cfg.index_n_heads * cfg.index_head_dim) \
            + sequences * scored * INDEX_K_ROW_BYTES
    if role.has_engram:
        rows = cfg.engram_dim // cfg.engram_head_dim  # looked-up table rows per token: FP8 values + UE8M0 scales
        out["engram"] = T * rows * (cfg.engram_head_dim + cfg.engram_head_dim // 32) \
            + 2 * T * (cfg.hc_mult * D + D)
    return out


def step_work(cfg: V41Config, tokens: int, context: int, sequences: int, ep: int = 1) -> dict[str, dict[str, float]]:
    """{stage: {"flops", "bytes"}} of one whole step of `cfg`'s layers and head on one rank: `sequences` sequences
    of tokens / sequences query tokens each, each ending at position context - 1 (prefill: one sequence of 4,096
    tokens; decode: `tokens` one-token sequences).

    ep > 1: one rank of EP x DP over `ep` ranks, each with such a batch. Everything but the routed experts is the
    rank's own; the rank holds 1 / ep of the routed experts, which the ep x tokens tokens of all ranks pick from,
    and computes ep x tokens x k / ep = tokens x k (token, expert) pairs in expectation, as on one GPU."""
    per_query = tokens // sequences
    layers_w, outside_w = weight_bytes_by_layer(cfg)
    routed = touched_fraction(ep * tokens, cfg.num_experts_per_tok, cfg.n_routed_experts) / ep
    work: dict[str, dict[str, float]] = defaultdict(lambda: {"flops": 0.0, "bytes": 0.0})
    for role in cfg.layer_roles:
        for stage, f in stage_flops(cfg, role, per_query, context - per_query).items():
            work[stage]["flops"] += f * sequences
        for stage, b in activation_bytes(cfg, role, tokens, context, sequences).items():
            work[stage]["bytes"] += b
        for stage, b in layers_w[role.layer_id].items():
            if stage == "moe experts (routed)":
                work["moe experts"]["bytes"] += b * routed
            elif stage != "engram (table)":  # its looked-up rows are counted with the activations
                work[stage]["bytes"] += b
    for stage in ("head", "norm"):
        work[stage]["bytes"] += outside_w[stage]
    work["head"]["flops"] += 2 * sequences * cfg.hidden_size * cfg.vocab_size
    return {s: dict(w) for s, w in work.items() if s in ESTIMATED}


def floors_ms(work: dict[str, dict[str, float]], fp8_tflops: float, bf16_tflops: float, copy_gbs: float
              ) -> dict[str, dict[str, float]]:
    """{stage: {"compute_ms", "memory_ms", "floor_ms", "bound"}} from step_work's FLOPs and bytes."""
    out = {}
    for stage, w in work.items():
        rate = fp8_tflops if stage in FP8_STAGES else bf16_tflops
        compute, memory = w["flops"] / rate / 1e9, w["bytes"] / copy_gbs / 1e6
        out[stage] = {"compute_ms": compute, "memory_ms": memory, "floor_ms": max(compute, memory),
                      "bound": "compute" if compute >= memory else "memory"}
    return out


def compare(measured: dict[str, float], floors: dict[str, dict[str, float]]) -> dict:
    """Rows per stage (measured, floor, floor / measured, bound), sorted by measured time, and the step floors."""
    rows = []
    for stage, ms in sorted(measured.items(), key=lambda kv: -kv[1]):
        f = floors.get(stage)
        rows.append({"stage": stage, "measured_ms": ms,
                     **({"floor_ms": f["floor_ms"], "floor_over_measured": f["floor_ms"] / ms,
                         "bound": f["bound"],
                         "compute_ms": f["compute_ms"], "memory_ms": f["memory_ms"]} if f else {})})
    estimated = [r for r in rows if "floor_ms" in r]
    overlap = max(sum(f["compute_ms"] for f in floors.values()), sum(f["memory_ms"] for f in floors.values()))
    return {"stages": rows,
            "measured_ms": sum(measured.values()),
            "estimated_measured_ms": sum(r["measured_ms"] for r in estimated),
            "sum_of_stage_floors_ms": sum(r["floor_ms"] for r in estimated),
            "overlapped_floor_ms": overlap,
            "not_estimated_ms": sum(r["measured_ms"] for r in rows if "floor_ms" not in r)}


def shown(path: Path) -> str:
    """A path as the tables name it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def prefill_case(path: Path, cfg: V41Config, bf16_tflops: float, copy_gbs: float) -> dict:
    """The comparison for a bench_prefill.py JSON (its stages' 40-layer ms, its own FP8 rate)."""
    res = json.loads(path.read_text())
    w = res["workload"]
    fp8 = res["fp8_matmul"]["tflops"]
    work = step_work(cfg, w["tokens"], w["context"], w["sequences"])
    floors = floors_ms(work, fp8, bf16_tflops, copy_gbs)
    return {"source": shown(path), "case": f"prefill {w['tokens']} tokens at {w['context']}",
            "workload": (w["tokens"], w["context"], w["sequences"]),
            "environment": res["environment"], "fp8_tflops": fp8,
            **compare(res["stages"]["summary"]["forty_layer_ms"], floors)}


def decode_cases(path: Path, cfg: V41Config, fp8_tflops: float, bf16_tflops: float, copy_gbs: float) -> list[dict]:
    """One comparison per result of a bench_decode.py JSON that has a --profile breakdown (profile_eager)."""
    res = json.loads(path.read_text())
    out = []
    for r in res["results"]:
        if "profile_eager" not in r:
            continue
        B, C = r["batch"], r["context"]
        work = step_work(cfg, B, C, B)
        floors = floors_ms(work, fp8_tflops, bf16_tflops, copy_gbs)
        out.append({"source": shown(path), "case": f"decode batch {B} at {C}", "workload": (B, C, B),
                    "environment": res["environment"],
                    **compare(r["profile_eager"]["forty_layer_ms_per_step"], floors)})
    return out


def prefill_token_sweep(cfg: V41Config, context: int, fp8_tflops: float, bf16_tflops: float, copy_gbs: float,
                        tokens: Sequence[int] = SWEEP_TOKENS) -> list[dict]:
    """The sum of the stage floors of one prefill step ending at `context`, per tokens per step: where the routed
    experts turn from bound by weight bytes (read once per step, whatever the tokens) to bound by FLOPs."""
    rows = []
    for t in tokens:
        floors = floors_ms(step_work(cfg, t, context, 1), fp8_tflops, bf16_tflops, copy_gbs)
        step = sum(f["floor_ms"] for f in floors.values())
        moe = floors["moe experts"]
        rows.append({"tokens": t, "floor_ms": step, "tokens_per_s": t / step * 1e3,
                     "moe_compute_ms": moe["compute_ms"], "moe_memory_ms": moe["memory_ms"]})
    return rows


def ep_floors(cfg: V41Config, cases: Sequence[dict], fp8_tflops: float, bf16_tflops: float, copy_gbs: float,
              ep_sizes: Sequence[int] = EP_SIZES) -> list[dict]:
    """Per rank, the sum of the stage floors and the routed experts' floor of each case's workload under EP x DP
    over each of `ep_sizes` ranks (arithmetic only: no EP run is compared; dispatch / combine not estimated)."""
    rows = []
    for case in cases:
        tokens, context, sequences = case["workload"]
        for ep in ep_sizes:
            floors = floors_ms(step_work(cfg, tokens, context, sequences, ep), fp8_tflops, bf16_tflops, copy_gbs)
            moe = floors["moe experts"]
            rows.append({"case": case["case"], "ep": ep, "floor_ms": sum(f["floor_ms"] for f in floors.values()),
                         "moe_floor_ms": moe["floor_ms"],
                         "moe_bound": moe["bound"]})
    return rows


def print_case(case: dict) -> None:
    env = case["environment"]
    print(f"\n### {case['case']} ({case['source']}: {env['hardware']['gpu']}, torch {env['torch']}, triton "
          f"{env['triton']}, {env['date'][:10]}, commit {env['git_commit'][:7]})\n")
    print("| stage | measured ms | floor ms | floor / measured | bound | compute ms | memory ms |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in case["stages"]:
        if "floor_ms" in r:
            print(f"| {r['stage']} | {r['measured_ms']:.2f} | {r['floor_ms']:.2f} | {r['floor_over_measured']:.2f} "
                  f"| {r['bound']} | {r['compute_ms']:.2f} | {r['memory_ms']:.2f} |")
        else:
            print(f"| {r['stage']} | {r['measured_ms']:.2f} | not estimated | | | | |")
    print(f"| **step** | {case['measured_ms']:.1f} | sum of stage floors {case['sum_of_stage_floors_ms']:.1f} "
          f"| {case['sum_of_stage_floors_ms'] / case['measured_ms']:.2f} | overlapped {case['overlapped_floor_ms']:.1f}"
          f" | | |")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", type=Path, default=DEFAULT_PREFILL, help="bench_prefill.py JSON with stages")
    p.add_argument("--decode", type=Path, nargs="*", default=list(DEFAULT_DECODE),
                   help="bench_decode.py JSONs; results with a profile_eager are used")
    p.add_argument("--copy-json", type=Path, default=DEFAULT_COPY, help="JSON with copy_gbs (device copy, GB/s)")
    p.add_argument("--bf16-tflops", type=float, default=BF16_TFLOPS)
    p.add_argument("--out", type=Path, help="write the cases as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    cfg = V41Config()
    copy_gbs = json.loads(args.copy_json.read_text())["copy_gbs"]
    prefill = prefill_case(args.prefill, cfg, args.bf16_tflops, copy_gbs)
    cases = [prefill] + [c for d in args.decode
                         for c in decode_cases(d, cfg, prefill["fp8_tflops"], args.bf16_tflops, copy_gbs)]
    print(f"rates: FP8 {prefill['fp8_tflops']:.0f} TFLOP/s ({prefill['source']}), bf16 {args.bf16_tflops:.0f} "
          f"TFLOP/s, copy {copy_gbs:.0f} GB/s ({shown(args.copy_json)})")
    for case in cases:
        print_case(case)
    context = prefill["workload"][1]
    sweep = prefill_token_sweep(cfg, context, prefill["fp8_tflops"], args.bf16_tflops, copy_gbs)
    print(f"\n### prefill floors by tokens per step (context {context})\n")
    print("| tokens | floor ms (sum of stages) | tokens/s at the floor | moe experts: compute ms | memory ms |")
    print("|---:|---:|---:|---:|---:|")
    for r in sweep:
        print(f"| {r['tokens']} | {r['floor_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['moe_compute_ms']:.1f} "
              f"| {r['moe_memory_ms']:.1f} |")
    ep = ep_floors(cfg, cases, prefill["fp8_tflops"], args.bf16_tflops, copy_gbs)
    print("\n### per-rank floors under EP x DP (arithmetic; each rank with the case's batch)\n")
    print("| case | EP ranks | floor ms (sum of stages) | moe experts floor ms | moe bound |")
    print("|---|---:|---:|---:|---|")
    for r in ep:
        print(f"| {r['case']} | {r['ep']} | {r['floor_ms']:.1f} | {r['moe_floor_ms']:.1f} | {r['moe_bound']} |")
    if args.out:
        rates = {"fp8_tflops": prefill["fp8_tflops"], "fp8_source": prefill["source"], "bf16_tflops": args.bf16_tflops,
                 "copy_gbs": copy_gbs, "copy_source": shown(args.copy_json)}
        args.out.write_text(json.dumps({"analysed": datetime.date.today().isoformat(), **rates, "cases": cases,
                                        "prefill_token_sweep": sweep, "ep_floors": ep}, indent=1))
    return cases


if __name__ == "__main__":
    main()
