"""Does the indexer's ragged batch (indexer_scores with query_starts, session 81) compute a score with the same
instructions as a call of one sequence? The arithmetic of the two kernels' compiled SASS, side by side (no GPU).

Why: the runtime scores a step's sequences together only because a sequence's scores must not depend on what it is
batched with (promise 3). The ragged form changes which queries and keys a program takes, not the arithmetic; this
lists the arithmetic instructions (tensor-core MMAs, bf16 conversions, packed relu / multiply, fp32 adds) of the
single-sequence and the ragged launch in program order and reports whether the sequences, their multisets, and the
order of the instructions that sum (MMAs, fp32 adds) match; the elementwise ones act on one value each, so their
order among themselves does not change a result.

    uv run python benchmarks/sass_diff.py HEAD -k indexer --out DIR      # records both trees' SASS
    python3 benchmarks/exp_indexer_ragged_sass.py DIR                     # the head side's launches compared
"""

from __future__ import annotations

import collections
import json
import re
import sys

ARITHMETIC = ("HGMMA", "HMMA", "F2FP", "HMNMX2", "HMUL2", "HFMA2", "HADD2", "FADD", "FMUL", "FFMA", "FMNMX", "F2F")
PAIRS = [  # (single-sequence case, ragged case, kernel)
    ("indexer_scores prefill 4096 x 65536]", "ragged prefill 64 sequences x 65536", "indexer_scores_kernel"),
    ("REINDEX prefill 4096 x 2048 blocks]", "ragged REINDEX prefill 64 sequences", "indexer_scores_per_query_kernel"),
]


def arithmetic(path: str) -> list[str]:
    ops = []
    for line in open(path):
        m = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m and m.group(1).split(".")[0] in ARITHMETIC:
            ops.append(m.group(1))
    return ops


def main(folder: str) -> None:
    records = [json.loads(line) for line in open(f"{folder}/head.jsonl")]

    def sass(case: str, kernel: str) -> list[str]:
        record = next(r for r in records if case in r["case"] and r["name"] == kernel)
        return arithmetic(f"{folder}/head.jsonl.sass/{record['sass']}.sass")

    for single, ragged, kernel in PAIRS:
        a, b = sass(single, kernel), sass(ragged, kernel)
        moved = sum(x != y for x, y in zip(a, b))
        # the instructions whose order is the order of a sum: the MMAs (each accumulates onto the last) and fp32 adds
        sums_a, sums_b = ([x for x in ops if x.startswith(("HGMMA", "HMMA", "FADD", "FFMA"))] for ops in (a, b))
        print(f"{kernel}: {len(a)} / {len(b)} arithmetic instructions; same order: {a == b}; same multiset: "
              f"{collections.Counter(a) == collections.Counter(b)}; positions that differ: {moved}; MMAs and fp32 "
              f"adds in the same order: {sums_a == sums_b}")
        print("  " + ", ".join(f"{k} {v}" for k, v in collections.Counter(a).most_common()))


if __name__ == "__main__":
    main(sys.argv[1])
