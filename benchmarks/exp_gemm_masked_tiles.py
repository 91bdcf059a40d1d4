"""Experiment (issue 4): the token tile of the masked FP8 x FP4 GEMM (MoE decode) on the Gluon one-warpgroup kernel.

The routed tile is 16 tokens at <= 16 expected rows per expert and 32 at <= 32 (default_config). With Poisson row
counts a tile that is smaller than an expert's rows makes that expert's weights stream once per token tile: at
expected_m = 32 most experts have 33-50 rows, so two 32-token tiles read the weights twice, which would explain why
the table reads 0.25 of the copy rate there against 0.39 at expected_m = 8. This times bench_deepgemm.py's masked
case (96 experts, max_m 128, Poisson(expected_m) rows, at least 1; the whole call: activation pass + GEMM) at token
tiles 16 / 32 / 64 and 3 / 4 stages, each checked bitwise against the routed config (same products, same order).
Writes $OUT/exp_gemm_masked_tiles.json.

Variants (--convert): the same calls at the routed tile with each of VARIANTS below (a config), each checked bitwise
against the shipped kernel. Session 16 run 1 measured two weight conversions as edited copies
against the 4-byte form shipped then: the byte-pair form (one asm per 2 bytes of a row, the 16-bit load used as is;
exact) at 1.06-1.11x, and with the 2^126 multiply folded into the scale (exact for UE8M0 weight bytes <= 128; the
data's are 118-125) at 1.09-1.17x. Offline (triton 3.6, sm_90a) the 16-token tile's K-step loop has 316 SASS
instructions per warp in the pair form and 285 folded (364 in the 4-byte form; docs/reports/deepgemm-gluon.md). Both
are in the package since, the fold as an option that the caller enables by bounding the scale bytes; VARIANTS now
holds the fold alone (run 3: 1.03x). Writes $OUT/exp_gemm_masked_convert.json.

Weight tiles (--weight-tiles, session 16 run 5): 64 / 128 weight rows per CTA and 3-6 stages, folded: the routed
tiles were within 2% of the best (docs/reports/deepgemm-gluon.md); the mode was removed after (commit 570e5c2).

Occupancy (--occupancy, session 17 run 1): ptxas register caps for more CTAs per SM were 0.50-0.92x, bitwise equal:
the kernel is issue-bound (docs/reports/profile-ncu-s17.md); the mode was removed after (commit a8c1404 has it).

    cd benchmarks && timeout 200 python3 exp_gemm_masked_tiles.py [--convert]
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton

from bench_deepgemm import copy_bandwidth_gbs  # beside this script
from exp_gemm_gluon_v3 import ms
from mini_deepgemm import gemm as G

SHAPES = {"w13": (4608, 5120), "w2": (5120, 2304)}

# --convert. The fold is the package's own option now (gemm_gluon_kernel.weights_of_step FOLD, cfg GLUON_FOLD, routed
# when the caller bounds the scale bytes at 128), so it is a config, not an edit. Session 16 run 3 also timed the ring
# slot refilled right after each step's barrier instead of after its MMAs (an edited copy; 1.00-1.03x, with the fold
# 1.00-1.01x: not shipped, commit 8d491ec has it).
# name: the config keys the variant sets on the routed config
VARIANTS = {"fold": {"GLUON_FOLD": True}}


def masked_operands(Gn: int, max_m: int, N: int, K: int, expected_m: int, gen, cpu):
    """(masked_m, a, sa, bq, sb) of bench_deepgemm.py's masked case: Poisson(expected_m) rows per expert (at least
    1, at most max_m), e4m3 activations with UE8M0 bytes, packed FP4 weights with UE8M0 bytes (uint8)."""
    masked_m = torch.clamp(torch.poisson(torch.full((Gn,), float(expected_m)), generator=cpu), 1, max_m).int().cuda()
    a = torch.randn(Gn, max_m, K, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa = torch.randint(120, 130, (Gn, max_m, K // 32), device="cuda", dtype=torch.uint8, generator=gen)
    bq = torch.randint(0, 256, (Gn, N, K // 2), dtype=torch.uint8, device="cuda", generator=gen)
    sb = torch.randint(118, 126, (Gn, N, K // 32), dtype=torch.uint8, device="cuda", generator=gen)
    return masked_m, a, sa, bq, sb


def cases(seed: int):
    """(name, N, K, expected_m, routed_case(...)) for both shapes at expected_m 8 and 32, cached blocks released
    after each."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cpu = torch.Generator().manual_seed(seed)
    for expected_m in (8, 32):
        for name, (N, K) in SHAPES.items():
            yield name, N, K, expected_m, routed_case(expected_m, N, K, gen, cpu)
            torch.cuda.empty_cache()


def routed_case(expected_m: int, N: int, K: int, gen, cpu):
    """bench_deepgemm.py's masked case (96 experts, max_m 128) at expected_m: (call(d, cfg), want from the routed
    config, routed config, used-row mask, masked_m, weight bytes, sb)."""
    Gn, max_m = 96, 128
    masked_m, a, sa, bq, sb = masked_operands(Gn, max_m, N, K, expected_m, gen, cpu)
    routed = G.default_config(G._MASKED, expected_m, 32, True, N, Gn, True)
    used = torch.arange(max_m, device="cuda")[None, :] < masked_m[:, None]

    def call(d, cfg):
        G._gemm(G._MASKED, (a, sa), (bq, sb), d, None, masked_m, None, True, expected_m=expected_m, config=cfg)

    want = torch.zeros(Gn, max_m, N, dtype=torch.bfloat16, device="cuda")
    call(want, routed)
    return call, want, routed, used, masked_m, bq.numel() + sb.numel(), sb


def bitwise_and_gbs(call, want, used, cfg: dict, weight_bytes: int) -> tuple[bool, float]:
    """One config: its output's used rows bitwise equal to want's, and its weight bytes per second."""
    d = torch.zeros_like(want)
    call(d, cfg)
    return bool(torch.equal(d[used], want[used])), weight_bytes / ms(lambda: call(d, cfg)) / 1e6


def write_rows(filename: str, rows: list[dict]) -> None:
    with open(os.path.join(os.environ.get("OUT", "."), filename), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       timing="do_bench_cudagraph median; copy by do_bench", rows=rows), f, indent=1)


def print_variant_table(rows: list[dict], labels: list[str], rate: str, variants: list[str]) -> None:
    """A variants table: the label columns, the shipped kernel's rate and each variant's (rate: the rows' key
    suffix, "gbs" or "tflops"), the best over shipped, and whether every variant was bitwise equal."""
    print("| " + " | ".join(labels) + f" | shipped {rate} | " + " | ".join(variants) + " | best / shipped | bitwise |")
    for r in rows:
        shipped, rates = r[f"shipped_{rate}"], [r[f"{k}_{rate}"] for k in variants]
        print("| " + " | ".join(f"{r[c]:.0f}" if isinstance(r[c], float) else str(r[c]) for c in labels)
              + f" | {shipped:.0f} | " + " | ".join(f"{v:.0f}" for v in rates)
              + f" | {max(rates) / shipped:.2f} | {all(r[f'{k}_bitwise'] for k in variants)} |")


def timed_rows(seed: int, configs, filename: str) -> list[dict]:
    """cases(seed), each call timed at every (key, config) of configs(routed) and checked bitwise
    against the routed config; one row per case, also written to $OUT/filename."""
    copy_gbs = copy_bandwidth_gbs()
    rows_out = []
    for name, N, K, expected_m, (call, want, routed, used, masked_m, weight_bytes, sb) in cases(seed):
        assert int(sb.max()) <= 128, "the folded conversion is exact only for UE8M0 weight bytes <= 128"
        row = dict(name=name, N=N, K=K, expected_m=expected_m, rows=int(masked_m.sum()),
                   max_rows=int(masked_m.max()), routed_block_m=routed["BLOCK_M"],
                   routed_stages=routed.get("GLUON_STAGES"), copy_gbs=copy_gbs)
        for key, cfg in configs(routed):
            row[f"{key}_bitwise"], row[f"{key}_gbs"] = bitwise_and_gbs(call, want, used, cfg, weight_bytes)
        rows_out.append(row)
        print(row, flush=True)
    write_rows(filename, rows_out)
    return rows_out


def convert() -> None:
    """The routed tile with the shipped kernel and each of VARIANTS (module docstring)."""
    rows_out = timed_rows(1, lambda routed: [("shipped", routed)]
                          + [(key, {**routed, **keys}) for key, keys in VARIANTS.items()],
                          "exp_gemm_masked_convert.json")
    print_variant_table(rows_out, ["name", "expected_m", "routed_block_m", "copy_gbs"], "gbs", list(VARIANTS))


def print_tile_table(rows_out: list[dict]) -> None:
    """GB/s per config column, one table per set of columns (rows may time different configs)."""
    header = None
    for r in rows_out:
        keys = [k[:-4] for k in r if k.endswith("_gbs") and k != "copy_gbs"]
        if keys != header:
            header = keys
            print("| shape | expected_m | routed tile | " + " | ".join(keys) + " | best / copy |")
        best = max(r[k + "_gbs"] for k in keys)
        print(f"| {r['name']} | {r['expected_m']} | {r['routed_block_m']} | "
              + " | ".join(f"{r[k + '_gbs']:.0f}" + ("" if r[k + "_bitwise"] else " (NOT bitwise)") for k in keys)
              + f" | {best / r['copy_gbs']:.2f} |")


def main() -> None:
    if "--convert" in sys.argv:
        convert()
        return
    print_tile_table(timed_rows(0, lambda routed: [
        (f"m{block_m}_s{stages}", {**routed, "BLOCK_M": block_m, "GLUON_STAGES": stages})
        for block_m in (16, 32, 64) for stages in (3, 4)], "exp_gemm_masked_tiles.json"))


if __name__ == "__main__":
    main()
