"""Prints one SHA-256 over the sparse attention's outputs (out and lse) on bench_flashmla's prefill case: bf16 rows,
the paged cache, and the paged cache's first 8 queries (a decode-sized call, split). Run on each side of an A/B to
check that a kernel change keeps every bit (gpu_session.sh's side_path).

    python3 benchmarks/attn_output_hash.py
"""

from __future__ import annotations

import hashlib

import mini_flashmla
import torch
from bench_flashmla import SCALE, prefill_case  # beside this (Python puts the script's folder on sys.path)


def main() -> None:
    c = prefill_case(torch.device("cuda"))
    caches = c["window_cache"], c["compressed_cache"]
    calls = (mini_flashmla.sparse_mla_fwd(c["q"], c["kv"], c["idx"], SCALE, c["sink"]),
             mini_flashmla.sparse_mla_fwd_paged(c["q"], *caches, c["wid"], c["cid"], SCALE, c["sink"]),
             mini_flashmla.sparse_mla_fwd_paged(c["q"][:8], *caches, c["wid"][:8], c["cid"][:8], SCALE, c["sink"]))
    digest = hashlib.sha256()
    for out, lse in calls:
        digest.update(out.view(torch.int16).cpu().numpy().tobytes())
        digest.update(lse.cpu().numpy().tobytes())
    print("attention outputs sha256", digest.hexdigest())


if __name__ == "__main__":
    main()
