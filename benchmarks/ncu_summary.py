"""Summaries of the Nsight Compute exports that gpu_s17.sh writes (profile_ncu.py's cases): per kernel, where the
cycles go (issue slots and pipes, from CASE_raw.csv) and what the warps execute and wait for (per-opcode counts
and stall samples, from CASE_sass.csv; per partition of a warp-specialized kernel since session 27). Runs anywhere
(no GPU): python3 benchmarks/ncu_summary.py DIR [CASE...]
The exports may be gzipped (CASE_raw.csv.gz, as committed under docs/reports/data/).

Pipe figures are ncu's "% of peak sustained elapsed": issue = sm__issue_active (one instruction per scheduler and
cycle), tensor = sm__pipe_tensor_cycles_active, fma / alu / uniform = sm__inst_executed_pipe_*; and the memory units
(session 71): smem = the shared-memory data pipe's 128-byte wavefronts (l1tex__data_pipe_lsu_wavefronts_mem_shared:
loads, stores and the wgmma operand reads; not sm__pipe_shared_cycles_active, which reads as the tensor pipe), l1 =
l1tex__throughput (L1 and the TMA unit), l2 = lts__throughput. Stall samples
exclude warps parked at a CTA barrier for the whole kernel (the padding warps of Gluon's warp specialization,
which sit on one NOP): they are counted apart as "idle"."""

from __future__ import annotations

import collections
import csv
import gzip
import io
import os
import sys

PIPES = {"issue %": "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
         "tensor %": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
         "fma %": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_elapsed",
         "alu %": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_elapsed",
         "uniform %": "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed",
         "smem %": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
         "l1 %": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
         "l2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
         "dram %": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"}
SKIP = ("elementwise", "arange", "Fill", "where_kernel")  # torch's small set-up kernels inside a profiled call


def read_export(folder: str, name: str) -> str:
    """The text of export `name` in folder, plain or gzipped."""
    path = os.path.join(folder, name)
    if os.path.exists(path):
        return open(path).read()
    with gzip.open(path + ".gz", "rt") as f:
        return f.read()


def pipe_rows(text: str) -> list[dict]:
    rows = list(csv.reader(io.StringIO(text)))
    head, units = rows[0], rows[1]
    out = []
    for r in rows[2:]:
        name = r[head.index("Kernel Name")]
        if any(s in name for s in SKIP):
            continue
        t = head.index("gpu__time_duration.sum")
        row = {"kernel": name.split("(")[0][:40],
               "us": float(r[t].replace(",", "")) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[units[t]]}
        for label, metric in PIPES.items():
            row[label] = float(r[head.index(metric)].replace(",", "")) if metric in head else float("nan")
        out.append(row)
    return out


def sass_kernels(text: str) -> list[tuple[str, list[dict]]]:
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            cur = [line.split(",")[1].strip('"'), []]
            blocks.append(cur)
        elif cur is not None:
            cur[1].append(line)
    return [(name, list(csv.DictReader(io.StringIO("\n".join(lines))))) for name, lines in blocks]


def opcode(source: str) -> str:
    parts = source.split()
    op = parts[1] if parts[0].startswith("@") else parts[0]
    return op.split(".")[0]


def sass_summary(name: str, rows: list[dict], top: int = 14) -> str:
    ops, stalls, idle = collections.Counter(), collections.Counter(), 0
    for r in rows:
        if not r["Source"].strip():
            continue
        op = opcode(r["Source"].strip())
        ops[op] += int(r["Instructions Executed"] or 0)
        reasons = {k[6:]: int(v) for k, v in r.items()
                   if k and k.startswith("stall_") and "Not Issued" not in k and v not in ("", "0")}
        if op == "NOP" and reasons.get("barrier", 0) > 0.9 * sum(reasons.values()):
            idle += sum(reasons.values())
            continue
        stalls.update(reasons)
    total, samples = sum(ops.values()), sum(stalls.values()) or 1
    mix = "  ".join(f"{op} {n / total:.1%}" for op, n in ops.most_common(top))
    why = "  ".join(f"{k} {v / samples:.1%}" for k, v in stalls.most_common(8))
    return (f"{name[:40]}: {total / 1e6:.1f}M warp instructions; {mix}\n"
            f"  stall samples of working warps ({samples}; idle padding warps {idle} more): {why}")


def partition_summary(rows: list[dict], floor: float = 0.01) -> str:
    """Stall samples per code region of a warp-specialized kernel: the SASS between consecutive setmaxnreg
    instructions (USETMAXREG), where Gluon's partitions begin, each with its share of all samples, its top stall
    reasons, and the shares on MMA waits (WARPGROUP.DEPBAR) and on mbarrier polls (try-wait and the branch that
    retries it, within 12 rows after it). Regions below `floor` of the samples are left out."""
    regions, start = [], 0
    for i, r in enumerate(rows):
        if "USETMAXREG" in r["Source"]:
            regions.append((start, i))
            start = i
    regions.append((start, len(rows)))
    samples = [int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows]
    total, lines = sum(samples) or 1, []
    for a, b in regions:
        part = sum(samples[a:b])
        if part < floor * total:
            continue
        reasons = collections.Counter()
        for r in rows[a:b]:
            reasons.update({k[6:]: int(v) for k, v in r.items()
                            if k and k.startswith("stall_") and "Not Issued" not in k and v not in ("", "0")})
        mma = sum(samples[i] for i in range(a, b) if "WARPGROUP.DEPBAR" in rows[i]["Source"])
        polls = [i for i in range(a, b) if "TRYWAIT" in rows[i]["Source"]]
        poll = sum(samples[i] for i in range(a, b) if i in polls
                   or ("BRA" in rows[i]["Source"] and any(i - 12 <= j < i for j in polls)))
        why = "  ".join(f"{k} {v / part:.0%}" for k, v in reasons.most_common(4))
        lines.append(f"  rows {a}-{b}: {part / total:.1%} of samples; MMA waits {mma / part:.0%}, mbarrier polls "
                     f"{poll / part:.0%}; {why}")
    return "\n".join(lines)


def main() -> None:
    folder, cases = sys.argv[1], sys.argv[2:]
    if not cases:
        cases = sorted(f.split("_raw.csv")[0] for f in os.listdir(folder) if "_raw.csv" in f)
    print("| case | kernel | us | " + " | ".join(PIPES) + " |")
    print("|---|---|---:|" + "---:|" * len(PIPES))
    for case in cases:
        for row in pipe_rows(read_export(folder, f"{case}_raw.csv")):
            print(f"| {case} | {row['kernel']} | {row['us']:.1f} | "
                  + " | ".join(f"{row[k]:.1f}" for k in PIPES) + " |")
    print()
    for case in cases:
        for name, rows in sass_kernels(read_export(folder, f"{case}_sass.csv")):
            if not any(s in name for s in SKIP):
                print(f"[{case}] " + sass_summary(name, rows))
                print(partition_summary(rows))


if __name__ == "__main__":
    main()
