"""Does ptxas leave mini-deepgemm's kernels short of registers? (session 8; docs/reports/deepep-v6-combine-queue.md)

mini-deepep's combine kernel ran ~10 us per call slower because ptxas chose 107 registers where its 2 programs per
SM allowed 128, and issued half of its loads at a time; `maxnreg` fixed it. This checks the GEMMs of the MoE and dense
paths: for each, the compiled kernel's registers, spills and shared memory, the programs per SM that its shared
memory and threads allow, and the time with `maxnreg` set to the register budget of that occupancy (outputs must be
bitwise equal). One GPU:

    python3 benchmarks/exp_register_budget.py      # JSON to $OUT/register_budget.json
"""

from __future__ import annotations

import json
import os

import torch
from bench_deepgemm import copy_bandwidth_gbs, dense_operands, moe_layout, ms, rand_fp8, rand_ue8m0

from mini_deepgemm import gemm as G
from mini_deepgemm.gemm_kernel import scaled_gemm_nt_kernel as gemm_kernel
from mini_deepgemm.gemm_swapab_kernel import swapab_gemm_kernel

SMEM_PER_SM, THREADS_PER_SM, REGS_PER_SM = 228 * 1024, 2048, 65536


def compiled_kernels(kernel) -> list:
    """Every compiled variant of a Triton JITFunction on the current device."""
    found = []
    for cache in kernel.device_caches.values():
        found += list(cache[0].values())
    return found


def occupancy(k) -> dict:
    """Registers, spills, shared bytes, warps; programs per SM by shared memory and threads; the register budget."""
    k._init_handles()
    warps = k.metadata.num_warps
    by_smem = max(1, SMEM_PER_SM // max(1, k.metadata.shared + 1024))  # 1 KiB reserved per block
    by_regs = REGS_PER_SM // (32 * warps * max(8, -(-k.n_regs // 8) * 8))
    programs = max(1, min(by_smem, THREADS_PER_SM // (32 * warps), by_regs))  # what runs per SM today
    # the registers that occupancy leaves each thread: above n_regs, ptxas could have used more at no cost
    budget = min(255, REGS_PER_SM // (32 * warps * programs) // 8 * 8)
    return {"regs": k.n_regs, "spills": k.n_spills, "shared": k.metadata.shared, "warps": warps,
            "programs_by_smem_threads": min(by_smem, THREADS_PER_SM // (32 * warps)), "programs_by_regs": by_regs,
            "programs_per_sm": programs, "budget": budget}


def with_maxnreg(kernel, maxnreg: int | None):
    """Make every launch of `kernel` pass maxnreg (None: restore)."""
    if "run" in kernel.__dict__:
        del kernel.run
    if maxnreg is not None:
        plain = kernel.run
        kernel.run = lambda *a, **kw: plain(*a, maxnreg=maxnreg, **kw)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    N, K = 4608, 5120
    cases = {}
    op = dense_operands(4096, N, K)
    cases["dense V4.1 4096 x 4608 x 5120"] = (
        lambda: G._gemm(G._DENSE, *op["v41"], op["d"], None, None, None, False), op["d"], 2 * 4096 * N * K, "tflops")
    rows, layout, _ = moe_layout(96, gen)
    a, sa = rand_fp8(layout.numel(), K), rand_ue8m0(layout.numel(), K // 32)
    bq = torch.randint(0, 256, (96, N, K // 2), dtype=torch.uint8, device="cuda")
    bs = rand_ue8m0(96, N, K // 32)
    dc = torch.empty(layout.numel(), N, dtype=torch.bfloat16, device="cuda")
    cases["contiguous FP4 96 experts, 128-1024 rows"] = (
        lambda: G._gemm(G._CONTIGUOUS, (a, sa), (bq, bs), dc, None, layout, None, True), dc, 2 * sum(rows) * N * K,
        "tflops")
    am, sam = rand_fp8(96, 128, K), rand_ue8m0(96, 128, K // 32)
    dm = torch.empty(96, 128, N, dtype=torch.bfloat16, device="cuda")
    masked_m = torch.full((96,), 8, dtype=torch.int32, device="cuda")
    cases["masked FP4 96 experts x 8 rows"] = (
        lambda: G._gemm(G._MASKED, (am, sam), (bq, bs), dm, None, masked_m, None, True, expected_m=8), dm,
        bq.numel() + bs.numel(), "GB/s of weights")
    copy = copy_bandwidth_gbs()
    results = {"device_copy_gbs": copy, "cases": {}}
    for name, (fn, out, work, unit) in cases.items():
        for kernel in (gemm_kernel, swapab_gemm_kernel):
            kernel.device_caches.clear()
        fn()
        torch.cuda.synchronize()
        kernels = [(kn, k) for kn, kernel in (("gemm_kernel", gemm_kernel), ("swapab_gemm_kernel", swapab_gemm_kernel))
                   for k in compiled_kernels(kernel)]
        entry = {"kernels": [dict(kernel=kn, **occupancy(k)) for kn, k in kernels]}
        reference = out.clone()
        t = ms(fn)
        entry["as_shipped_ms"] = t
        rate = (lambda ms_: work / ms_ / 1e9) if unit == "tflops" else (lambda ms_: work / ms_ / 1e6)
        entry["as_shipped"] = rate(t)
        for kn, k in kernels:
            budget = occupancy(k)["budget"]
            if budget <= k.n_regs:
                entry[f"{kn}: no register headroom"] = True
                continue
            kernel = gemm_kernel if kn == "gemm_kernel" else swapab_gemm_kernel
            with_maxnreg(kernel, budget)
            try:
                fn()
                torch.cuda.synchronize()
                entry[f"{kn} maxnreg {budget}: bitwise equal"] = bool(torch.equal(out, reference))
                t2 = ms(fn)
                entry[f"{kn} maxnreg {budget}"] = rate(t2)
                entry[f"{kn} maxnreg {budget}: registers"] = [occupancy(c)["regs"] for c in compiled_kernels(kernel)]
            except Exception as exc:  # noqa: BLE001 - a budget ptxas cannot meet is a result too
                entry[f"{kn} maxnreg {budget}: error"] = repr(exc)[-300:]
            finally:
                with_maxnreg(kernel, None)
        entry["unit"] = unit
        results["cases"][name] = entry
        print(name, json.dumps(entry, indent=1), flush=True)
    results["meta"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(os.path.join(os.environ.get("OUT", "."), "register_budget.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
