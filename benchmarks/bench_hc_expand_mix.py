"""The fused expand + mixes + collapse pass (hyper_connections.hc_expand_mix_collapse_fused, session 36) against
the three kernels it replaces in the engine's decoder block (hc_expand_fused, then hc_mixes_fused and
hc_collapse_fused of the expanded streams), one run.

Per T (tokens; D = 5,120, 4 streams): ms of the three calls in sequence and of the fused pass at each tiling of
TILINGS; each fused result checked against the separate kernels (H' equal or within one bf16 rounding, the mixes
within 1e-5, the collapse within one bf16 rounding); GB/s over the bytes the fused pass must move (read y and H,
write H' and the collapse; fn, the mixes and the split-K workspace not counted) and a torch device copy of the same
bytes in the same run. Times: bench_hc.median_ms (do_bench median, L2 cleared before each call).

Usage: python3 benchmarks/bench_hc_expand_mix.py [--tokens 64,4096] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch
from bench_hc import copy_ms, environment, inputs, median_ms, rate

from mini_deepinfer.layers import hyper_connections as hcf
from mini_deepinfer.models.deepseek_v41 import ops
from mini_deepinfer.models.deepseek_v41.config import V41Config

E = hcf.ExpandMixConfig
TILINGS = [hcf.DEFAULT_EXPAND_MIX, E(d_slice=128), E(d_slice=512), E(block_t=32, num_warps=4),
           E(block_t=32, num_warps=4, d_slice=128)]


def within_one_rounding(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float(), want.float()
    return bool(((got - want).abs() <= want.abs() * 2**-7 + 1e-6).all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="64,4096")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_hc_expand_mix.json"))
    args = ap.parse_args()
    cfg, D, device = V41Config(), 5120, "cuda"
    result = {"environment": environment(device), "D": D, "streams": hcf.HC,
              "tilings": [dataclasses.asdict(t) for t in TILINGS], "rows": []}
    for T in [int(t) for t in args.tokens.split(",")]:
        H, fn, scale, base, y = inputs(T, D, device, seed=T)
        pre, post, comb = ops.hc_mixes(H, fn, scale, base, cfg)

        def separate():
            new_H = hcf.hc_expand_fused(y, H, post, comb)
            return new_H, hcf.hc_mixes_fused(new_H, fn, scale, base, cfg), hcf.hc_collapse_fused(new_H, pre)

        want = separate()
        n_bytes = T * D * 2 + 2 * T * hcf.HC * D * 2 + T * D * 2
        row = {"T": T, "bytes": n_bytes, "separate_ms": median_ms(separate, device),
               "copy_ms": copy_ms(n_bytes, device), "fused": []}
        for tiling in TILINGS:
            got = hcf.hc_expand_mix_collapse_fused(y, H, post, comb, fn, scale, base, pre, cfg, tiling)
            mix_err = max((a - b).abs().max().item()
                          for a, b in zip(got[1], ops.hc_mixes(got[0], fn, scale, base, cfg)))
            ms = median_ms(lambda: hcf.hc_expand_mix_collapse_fused(y, H, post, comb, fn, scale, base, pre, cfg,
                                                                    tiling), device)
            row["fused"].append({"tiling": dataclasses.asdict(tiling), "ms": ms, "gbs": rate(ms, n_bytes),
                                 "H_equal_separate": torch.equal(got[0], want[0]),
                                 "H_within_one_rounding": within_one_rounding(got[0], want[0]),
                                 "mixes_max_abs_error_on_own_H": mix_err,
                                 "collapse_within_one_rounding": within_one_rounding(
                                     got[2], ops.hc_collapse(got[0], pre))})
        result["rows"].append(row)
        del H, fn, y, want
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    env = result["environment"]
    print(f"bench_hc_expand_mix: {env['hardware']} torch {env['torch']} triton {env['triton']} {env['date']} D={D}")
    print("| T | separate ms | copy ms | tiling (block_t, block_d, d_slice, warps) | fused ms | x separate | "
          "of copy | H' equal | checks |")
    print("|---:|---:|---:|---|---:|---:|---:|---|---|")
    for row in result["rows"]:
        for f in row["fused"]:
            t = f["tiling"]
            ok = f["H_within_one_rounding"] and f["collapse_within_one_rounding"] and \
                f["mixes_max_abs_error_on_own_H"] <= 1e-5
            print(f"| {row['T']} | {row['separate_ms']:.4f} | {row['copy_ms']:.4f} | {t['block_t']}, {t['block_d']}, "
                  f"{t['d_slice']}, {t['num_warps']} | {f['ms']:.4f} | {row['separate_ms'] / f['ms']:.2f}x | "
                  f"{row['copy_ms'] / f['ms']:.2f} | {f['H_equal_separate']} | "
                  f"{'ok' if ok else 'FAIL'} ({f['mixes_max_abs_error_on_own_H']:.1e}) |")


if __name__ == "__main__":
    main()
