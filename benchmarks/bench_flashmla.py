"""mini-flashmla microbenchmarks (issue 5) with their peers measured in the same run.

- sparse prefill, h = 64, d = 512, topk = 640 (128 window + 512 compressed), s_q = 4096, 131k-token context:
  bf16 rows (sparse_mla_fwd) and the paged FP8/FP4 cache (sparse_mla_fwd_paged);
  TFLOP/s = 2 * s_q * h * topk * (512 + 512) / t, also as a ratio to bf16 cuBLAS matmul (8192^3) in this run, and
  bf16 rows also as a ratio to a gather of the same rows (each query's 640 rows of 1 KB read into the SMs and summed,
  no attention; since session 40): at h = 64 a 1 KB row feeds 128 FLOP per byte, so the rate at which the SMs can
  gather rows bounds the kernel at 128 x that rate.
- sparse decode, batch 8 / 32 / 64 / 128 / 256, one query token each, same index shape, paged quantized cache, timed by
  CUDA-graph replay (device time; since session 13): GB/s = (q + retrieved rows x row bytes + out) / t, as a ratio
  to a device-to-device copy in this run.
- indexer scores, 4096 queries x 65,536 ratio-2 keys (131k context), 32 heads x 128: ratio to cuBLAS FP8
  per-tensor scaled_mm of the same GEMM [4096*32, 128] x [128, 65536]; top-k (512) timed separately.

Times are medians of triton.testing.do_bench (warm-up 25 ms, 100 ms of repetitions, L2 not flushed), decode's of
do_bench_cudagraph. Prints a
table last and writes JSON to $OUT/bench_flashmla.json (or ./bench_flashmla.json).
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch
import triton
import triton.language as tl
import triton.testing
from mini_deepgemm.reference import fp4_fakequant

import mini_flashmla
from mini_flashmla import api, reference
from mini_flashmla.cache_layout import INDEX_K_ROW_BYTES, pack_compressed_kv_fp4, pack_index_k_fp4, pack_window_fp8
from mini_flashmla.sparse_attn_kernel import FORMAT_BF16, FORMAT_FP4_COMPRESSED, FORMAT_FP8_WINDOW

H, D, W, TOPK_C, S_Q = 64, 512, 128, 512, 4096
CONTEXT, RATIO = 131072, 2
N_COMPRESSED = CONTEXT // RATIO
SCALE = D**-0.5
# 8 and 32 (since session 13): below 33 programs the Triton kernel splits the index lists; since session 26 the API
# splits on the Gluon kernel below one program per SM, and the rows show that against both kernels' earlier routes
DECODE_BATCHES = (8, 32, 64, 128, 256)
INDEXER_DECODE_BATCHES = (64, 256)  # the per-query indexer kernel's recorded batches (sessions 14-32)
DECODE_SPLIT_SWEEP = (1, 2, 3, 4, 5, 10)  # 640 slots = 10 blocks: 10 / 5 / 4 / 3 / 2 / 1 blocks per split
L2_POOL_ROWS = 16384  # bf16 rows: 16 MB, well inside the H200's L2


def bench(fn) -> float:
    """Median milliseconds."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def peers(dev) -> dict:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = bench(lambda: a @ a)
    bf16_tflops = 2 * 8192**3 / t / 1e9
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() / t / 1e6  # read + write
    return {"bf16_matmul_tflops": bf16_tflops, "device_copy_gbs": copy_gbs}


def window_ids_for(positions: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Ring rows slot*128 + p % 128 of the last 128 positions <= pos (-1 before the sequence start)."""
    p = positions[:, None] - torch.arange(W - 1, -1, -1, device=positions.device)[None, :]
    return torch.where(p >= 0, slot[:, None] * W + p % W, -1).to(torch.int32)


def prefill_case(dev) -> dict:
    """The prefill shape's inputs: q, sink; bf16 rows (one kv array of the context, window rows the last tokens, 128
    window + 512 random earlier rows per query: kv, idx); the paged quantized cache of one sequence in slot 0 with
    compressed entries in contiguous blocks (window_cache, compressed_cache, wid, cid)."""
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(S_Q, H, D, device=dev, generator=g).bfloat16()
    sink = torch.randn(H, device=dev, generator=g)
    positions = torch.arange(CONTEXT - S_Q, CONTEXT, device=dev)
    kv = torch.randn(CONTEXT, D, device=dev, generator=g).bfloat16()
    win = positions[:, None] - torch.arange(W - 1, -1, -1, device=dev)[None, :]
    comp = torch.randint(0, CONTEXT - S_Q, (S_Q, TOPK_C), device=dev, generator=g).sort(1).values
    idx = torch.cat([win, comp], 1).to(torch.int32)
    window_cache = pack_window_fp8(torch.randn(W, D, device=dev, generator=g))
    compressed_cache = pack_compressed_kv_fp4(torch.randn(N_COMPRESSED, D, device=dev, generator=g))
    wid = window_ids_for(positions, torch.zeros(S_Q, dtype=torch.long, device=dev))
    cid = torch.randint(0, N_COMPRESSED - S_Q // RATIO, (S_Q, TOPK_C), device=dev, generator=g).sort(1).values
    return dict(q=q, sink=sink, kv=kv, idx=idx, window_cache=window_cache, compressed_cache=compressed_cache,
                wid=wid, cid=cid.to(torch.int32))


@triton.jit
def gather_rows_kernel(kv_ptr, ids_ptr, out_ptr, n_ids, ROWS: tl.constexpr, D_: tl.constexpr):
    """out[q] = sum of kv's rows ids[q, :] (fp32; -1 reads row 0): the bytes the attention gathers, without it."""
    q = tl.program_id(0)
    cols = tl.arange(0, D_)
    acc = tl.zeros([ROWS, D_], tl.float32)
    for j in range(0, n_ids, ROWS):
        pos = j + tl.arange(0, ROWS)
        rows = tl.load(ids_ptr + q * n_ids + pos, mask=pos < n_ids, other=0)
        acc += tl.load(kv_ptr + tl.maximum(rows, 0).to(tl.int64)[:, None] * D_ + cols[None, :],
                       mask=(pos < n_ids)[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + q * D_ + cols, tl.sum(acc, 0))


def gather_peer_gbs(kv: torch.Tensor, idx: torch.Tensor) -> float:
    """GB/s of rows gathered into the SMs by gather_rows_kernel (one program per query), the best over rows per
    step and warp counts."""
    out = torch.empty(idx.shape[0], kv.shape[1], device=kv.device)
    n_bytes = idx.numel() * kv.shape[1] * kv.element_size()
    best = min(bench(lambda r=r, w=w: gather_rows_kernel[(idx.shape[0],)](kv, idx, out, idx.shape[1], ROWS=r, D_=D,
                                                                           num_warps=w))
               for r in (8, 16, 32) for w in (4, 8))
    return n_bytes / best / 1e6


def bench_prefill(dev, result: dict) -> None:
    c = prefill_case(dev)
    q, sink, kv, idx = c["q"], c["sink"], c["kv"], c["idx"]
    window_cache, compressed_cache, wid, cid = c["window_cache"], c["compressed_cache"], c["wid"], c["cid"]
    flops = 2 * S_Q * H * (W + TOPK_C) * (D + D)
    t = bench(lambda: mini_flashmla.sparse_mla_fwd(q, kv, idx, SCALE, sink))  # Gluon where _gluon_runs_on
    result["prefill_bf16_kernel"] = "gluon" if api._gluon_runs_on(q, kv) else "triton"
    result["prefill_bf16_ms"] = t
    result["prefill_bf16_tflops"] = flops / t / 1e9
    result["prefill_bf16_gather_peer_gbs"] = gather_peer_gbs(kv, idx)
    # the kernel's gathered bytes per second against the peer's: 1 KB per slot
    gathered_gbs = S_Q * (W + TOPK_C) * D * 2 / t / 1e6
    result["prefill_bf16_of_gather_peer"] = gathered_gbs / result["prefill_bf16_gather_peer_gbs"]
    # the same, every row from a 16 MB pool (the first 16,384 rows; L2-resident): the L2's rate, not the DRAM's
    idx_l2 = torch.where(idx >= 0, idx % L2_POOL_ROWS, idx)
    t = bench(lambda: mini_flashmla.sparse_mla_fwd(q, kv, idx_l2, SCALE, sink))
    result["prefill_bf16_l2_pool_tflops"] = flops / t / 1e9
    result["prefill_bf16_l2_pool_gather_peer_gbs"] = gather_peer_gbs(kv, idx_l2)
    bf16_source = (kv, idx, FORMAT_BF16.value)
    t = bench(lambda: api._launch_sparse_attn(q, bf16_source, None, SCALE, sink, 1))
    result["prefill_bf16_triton_tflops"] = flops / t / 1e9

    def fn():  # the public API: the Gluon kernel where _gluon_runs_on, else the Triton kernel
        return mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, SCALE, sink)

    t = bench(fn)
    result["prefill_paged_kernel"] = "gluon" if api._gluon_runs_on(q, window_cache, compressed_cache) else "triton"
    result["prefill_paged_ms"] = t
    result["prefill_paged_tflops"] = flops / t / 1e9
    sources = (window_cache, wid, FORMAT_FP8_WINDOW.value), (compressed_cache, cid, FORMAT_FP4_COMPRESSED.value)
    t = bench(lambda: api._launch_sparse_attn(q, *sources, SCALE, sink, 1))
    result["prefill_paged_triton_tflops"] = flops / t / 1e9
    # Launch-option sweep of the Triton kernel: bf16 rows at the pipelining depth they do not ship with (2 -> 1).
    launch = api.ATTN_LAUNCH_64_HEADS["bf16"]
    shipped = launch["num_stages"]
    launch["num_stages"] = other = 3 - shipped
    try:
        result[f"prefill_bf16_triton_stages{other}_tflops"] = flops / bench(
            lambda: api._launch_sparse_attn(q, bf16_source, None, SCALE, sink, 1)) / 1e9
    finally:
        launch["num_stages"] = shipped
    # correctness at this scale on the first 256 queries (relative L2 against the reference)
    out, _ = fn()
    ref, _ = reference.sparse_attn_paged_ref(q[:256], window_cache, compressed_cache, wid[:256], cid[:256], SCALE, sink)
    result["prefill_paged_rel_l2_first256"] = ((out[:256].float() - ref.float()).norm() / ref.float().norm()).item()
    tri, _ = api._launch_sparse_attn(q, *sources, SCALE, sink, 1)
    result["prefill_paged_rel_l2_vs_triton"] = ((out.float() - tri.float()).norm() / tri.float().norm()).item()


def decode_case(dev, batch: int, g: torch.Generator):
    """(q, window_cache, compressed_cache, wid, cid, sink) of a decode step: one query per sequence, every sequence
    with its own window ring and N_COMPRESSED compressed rows, TOPK_C of them picked at random."""
    q = torch.randn(batch, H, D, device=dev, generator=g).bfloat16()
    sink = torch.randn(H, device=dev, generator=g)
    window_cache = pack_window_fp8(torch.randn(batch * W, D, device=dev, generator=g))
    compressed_cache = pack_compressed_kv_fp4(torch.randn(batch * N_COMPRESSED // 8, D, device=dev, generator=g))
    compressed_cache = compressed_cache.repeat(8, 1)  # 8x fewer random numbers to pack; the bytes are the same
    seq = torch.arange(batch, device=dev)
    wid = window_ids_for(torch.full((batch,), CONTEXT - 1, device=dev), seq)
    cid = torch.stack([torch.randperm(N_COMPRESSED, device=dev, generator=g)[:TOPK_C].sort().values
                       for _ in range(batch)]) + seq[:, None] * N_COMPRESSED
    return q, window_cache, compressed_cache, wid, cid.to(torch.int32), sink


def paged_cases(dev, batches: tuple[int, ...]) -> list[tuple]:
    """[(name, q, window_cache, compressed_cache, wid, cid, sink)]: the prefill case's paged inputs, then a decode
    case per batch (decode_case, generator seed 1): the experiments' list of sparse_mla_fwd_paged calls."""
    c = prefill_case(dev)
    cases = [("prefill s_q 4096", c["q"], c["window_cache"], c["compressed_cache"], c["wid"], c["cid"], c["sink"])]
    for batch in batches:
        cases.append((f"decode batch {batch}", *decode_case(dev, batch, torch.Generator(device=dev).manual_seed(1))))
    return cases


def bench_graph(fn) -> float:
    """Median milliseconds of CUDA-graph replays: device time only, as the engine's captured decode step runs it.
    A decode call's host work (argument checks, routing, descriptors: ~90-130 us per call on the GPU machine) is
    longer than its kernel, so bench() would time the host (session 13 run 2: the public API at batch 64 took
    130.9 us in bench() against the Triton kernel's 91.6 us launched directly)."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def bench_decode(dev, result: dict) -> None:
    """Device time of the public API (its routing: the Gluon kernel where _gluon_runs_on, else the Triton kernel,
    split where _default_num_splits says), of each kernel forced unsplit, of the Triton kernel at the API's split count
    (the API's call off the Gluon route), of each kernel at every count of DECODE_SPLIT_SWEEP (the
    split rules' evidence; the Triton kernel's since session 75), and the API's host-inclusive time."""
    g = torch.Generator(device=dev).manual_seed(1)
    for batch in DECODE_BATCHES:
        q, window_cache, compressed_cache, wid, cid, sink = decode_case(dev, batch, g)

        def public_api():
            return mini_flashmla.sparse_mla_fwd_paged(q, window_cache, compressed_cache, wid, cid, SCALE, sink)

        sources = (window_cache, wid, FORMAT_FP8_WINDOW.value), (compressed_cache, cid, FORMAT_FP4_COMPRESSED.value)
        t = bench_graph(public_api)
        nbytes = q.numel() * 2 + batch * (W * 528 + TOPK_C * 288) + batch * H * D * 2
        result[f"decode_b{batch}_us"] = t * 1e3
        result[f"decode_b{batch}_host_inclusive_us"] = bench(public_api) * 1e3
        result[f"decode_b{batch}_triton_one_split_us"] = 1e3 * bench_graph(
            lambda: api._launch_sparse_attn(q, *sources, SCALE, sink, 1))
        result[f"decode_b{batch}_gluon_us"] = 1e3 * bench_graph(lambda: api._launch_gluon(q, *sources, SCALE, sink))
        # the API's route and split count (one rule for both kernels, cut to whole blocks), and the Triton kernel at
        # that count (the API's call off the Gluon route)
        gluon_route = api._gluon_runs_on(q, window_cache, compressed_cache)
        splits, _ = api._split_blocks(api._walk_blocks(W, TOPK_C), api._default_num_splits(q, W + TOPK_C))
        result[f"decode_b{batch}_route"] = "gluon" if gluon_route else "triton"
        result[f"decode_b{batch}_splits"] = splits
        result[f"decode_b{batch}_triton_split_us"] = 1e3 * bench_graph(
            lambda: api._launch_sparse_attn(q, *sources, SCALE, sink, splits))
        for kernel, launch in (("gluon", api._launch_gluon), ("triton", api._launch_sparse_attn)):
            result[f"decode_b{batch}_{kernel}_split_sweep_us"] = {  # the split rules' evidence: every count tried
                count: 1e3 * bench_graph(lambda: launch(q, *sources, SCALE, sink, count))
                for count in DECODE_SPLIT_SWEEP}
        if splits > 1:  # the merge's share of the split call: combine_splits_kernel alone on this call's partials
            part_out, part_lse = api._split_partials(q, splits)
            part_out.normal_(generator=g)
            part_lse.normal_(generator=g)
            out_c, lse_c = torch.empty_like(q), torch.empty(q.shape[:2], device=dev)
            sink_c = api._sink_arg(sink, lse_c)
            result[f"decode_b{batch}_combine_us"] = 1e3 * bench_graph(
                lambda: api._combine_splits(part_out, part_lse, sink_c, sink is not None, out_c, lse_c))
        result[f"decode_b{batch}_gbs"] = nbytes / t / 1e6
        out, _ = public_api()
        gluon_out, _ = api._launch_gluon(q, *sources, SCALE, sink)
        result[f"decode_b{batch}_gluon_rel_l2_vs_api"] = ((gluon_out.float() - out.float()).norm()
                                                          / out.float().norm()).item()


INDEX_HEADS, INDEX_DIM = 32, 128


def indexer_prefill_case(dev) -> tuple[torch.Tensor, ...]:
    """(q, w, cache, visible, rows) of the indexer at the prefill shape: S_Q queries of INDEX_HEADS x INDEX_DIM (FP4
    fake-quantized), their head weights, N_COMPRESSED packed FP4 keys of one sequence in contiguous rows, and each
    query's visible count (causal by compressed position). Shared by bench_topk.py and the indexer experiments."""
    g = torch.Generator(device=dev).manual_seed(2)
    q = fp4_fakequant(torch.randn(S_Q, INDEX_HEADS, INDEX_DIM, device=dev, generator=g), 32, "ue8m0").bfloat16()
    w = (torch.randn(S_Q, INDEX_HEADS, device=dev, generator=g) * 0.02).bfloat16()
    cache = pack_index_k_fp4(torch.randn(N_COMPRESSED, INDEX_DIM, device=dev, generator=g))
    rows = mini_flashmla.key_range_rows(0, N_COMPRESSED, dev)
    visible = (torch.arange(CONTEXT - S_Q, CONTEXT, device=dev) + 1) // RATIO
    return q, w, cache, visible, rows


def indexer_decode_case(dev, batch: int) -> tuple[torch.Tensor, ...]:
    """(q, w, cache, visible, key_rows) of the indexer's per-query (decode) path: `batch` queries, one per sequence,
    each with its own N_COMPRESSED keys (131k context), the cache's rows an 8-fold repeat of batch x N_COMPRESSED / 8
    random keys (the keys' values do not change the kernel's work). Shared by exp_indexer_tiles.py --per-query and
    profile_ncu.py's indexer_decode case."""
    g = torch.Generator(device=dev).manual_seed(3)
    q = fp4_fakequant(torch.randn(batch, INDEX_HEADS, INDEX_DIM, device=dev, generator=g), 32, "ue8m0").bfloat16()
    w = (torch.randn(batch, INDEX_HEADS, device=dev, generator=g) * 0.02).bfloat16()
    cache = pack_index_k_fp4(torch.randn(batch * N_COMPRESSED // 8, INDEX_DIM, device=dev, generator=g)).repeat(8, 1)
    key_rows = (torch.arange(batch, device=dev, dtype=torch.int32)[:, None] * N_COMPRESSED
                + torch.arange(N_COMPRESSED, device=dev, dtype=torch.int32)[None, :])
    visible = torch.full((batch,), N_COMPRESSED, dtype=torch.int64, device=dev)
    return q, w, cache, visible, key_rows


def bench_indexer(dev, result: dict) -> None:
    n_heads, d = INDEX_HEADS, INDEX_DIM
    q, w, cache, visible, rows = indexer_prefill_case(dev)
    t = bench(lambda: mini_flashmla.indexer_scores(q, w, cache, visible, rows))
    result["indexer_scores_ms"] = t
    result["indexer_tflops"] = 2 * S_Q * n_heads * d * N_COMPRESSED / t / 1e9
    score = mini_flashmla.indexer_scores(q, w, cache, visible, rows)
    # the exact kernel (lowest position wins ties); older JSONs' "topk_ms" timed the torch reference instead
    result["topk_kernel_ms"] = bench(lambda: mini_flashmla.topk_of_scores(score, 512))
    result["indexer_plus_topk_chunked_ms"] = bench(lambda: mini_flashmla.indexer_topk(q, w, cache, visible, rows, 512))

    t = indexer_peer_ms(dev, n_heads, d)
    result["fp8_scaled_mm_same_gemm_ms"] = t
    result["fp8_scaled_mm_tflops"] = 2 * S_Q * n_heads * d * N_COMPRESSED / t / 1e9
    for batch in INDEXER_DECODE_BATCHES:  # the per-query kernel: its peer is the device copy of its keys
        t = bench_graph(lambda case=indexer_decode_case(dev, batch): mini_flashmla.indexer_scores(*case))
        result[f"indexer_decode_b{batch}_ms"] = t
        result[f"indexer_decode_b{batch}_key_gbs"] = batch * N_COMPRESSED * INDEX_K_ROW_BYTES / t / 1e6


def indexer_peer_ms(dev, n_heads: int, d: int) -> float:
    """The indexer's peer: cuBLAS FP8 per-tensor scaled_mm of the same GEMM, [S_Q * n_heads, d] x [d, N_COMPRESSED]
    with a bf16 output (bound by writing that output: 17 GB at 32 heads)."""
    a = torch.randn(S_Q * n_heads, d, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(N_COMPRESSED, d, device=dev).to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    return bench(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def environment(dev: torch.device) -> dict:
    """Date, GPU and versions: the head of every result JSON of the attention-side benchmarks."""
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    dev = torch.device("cuda")
    result = environment(dev)
    result.update(peers(dev))
    parts = os.environ.get("BENCH_PARTS", "prefill,decode,indexer").split(",")
    for part in (globals()[f"bench_{name}"] for name in parts):
        try:
            part(dev, result)
        except Exception as exc:  # keep the other parts' numbers if one fails
            result[f"{part.__name__}_error"] = repr(exc)[:500]
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, os.environ.get("BENCH_JSON", "bench_flashmla.json")), "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)


def print_table(result: dict) -> None:
    print("\n| metric | value | ratio to peer |\n|---|---|---|")
    pb, pc = result["bf16_matmul_tflops"], result["device_copy_gbs"]
    print(f"| bf16 cuBLAS 8192^3 | {pb:.0f} TFLOP/s | |\n| device copy | {pc:.0f} GB/s | |")
    for k in (k for k in result if k.endswith("_error")):  # a failed part: its rows are missing below
        print(f"| {k} | {result[k]} | |")
    for k in ("prefill_bf16_tflops", "prefill_bf16_triton_tflops", "prefill_paged_tflops",
              "prefill_paged_triton_tflops", "prefill_bf16_triton_stages1_tflops"):
        if k in result:
            print(f"| {k} | {result[k]:.1f} TFLOP/s | {result[k] / pb:.2f} of bf16 cuBLAS |")
    if "prefill_bf16_gather_peer_gbs" in result:
        peer, peer_l2 = result["prefill_bf16_gather_peer_gbs"], result["prefill_bf16_l2_pool_gather_peer_gbs"]
        print(f"| the same rows gathered (no attention) | {peer:.0f} GB/s = a bound of {peer * 128 / 1e3:.0f} TFLOP/s "
              f"at 128 FLOP per byte | bf16 rows at {result['prefill_bf16_of_gather_peer']:.2f} of its rate |")
        print(f"| bf16 rows from a 16,384-row (L2-resident) pool | {result['prefill_bf16_l2_pool_tflops']:.1f} "
              f"TFLOP/s; its rows gathered {peer_l2:.0f} GB/s = a bound of {peer_l2 * 128 / 1e3:.0f} TFLOP/s | |")
    for b in DECODE_BATCHES:
        if f"decode_b{b}_gbs" in result:
            print(f"| decode batch {b} (graph replay) | {result[f'decode_b{b}_us']:.1f} us, "
                  f"{result[f'decode_b{b}_gbs']:.0f} GB/s, {result[f'decode_b{b}_route']} kernel in "
                  f"{result[f'decode_b{b}_splits']} split(s) (kernels unsplit: "
                  f"Gluon {result[f'decode_b{b}_gluon_us']:.1f} us, Triton "
                  f"{result[f'decode_b{b}_triton_one_split_us']:.1f} us; Triton in as many splits "
                  f"{result[f'decode_b{b}_triton_split_us']:.1f} us; API with host time "
                  f"{result[f'decode_b{b}_host_inclusive_us']:.1f} us) "
                  f"| {result[f'decode_b{b}_gbs'] / pc:.2f} of copy |")
    for b in DECODE_BATCHES:
        combine = result.get(f"decode_b{b}_combine_us")
        for kernel in ("Gluon", "Triton"):
            sweep = result.get(f"decode_b{b}_{kernel.lower()}_split_sweep_us")
            if sweep:
                print(f"| decode batch {b}, {kernel} by split count | "
                      + ", ".join(f"{s}: {t:.1f} us" for s, t in sweep.items())
                      + (f"; the merge alone {combine:.1f} us" if combine else "") + " | |")
    for b in INDEXER_DECODE_BATCHES:
        if f"indexer_decode_b{b}_ms" in result:
            print(f"| indexer decode (per-query keys, 131k context), batch {b} (graph replay) | "
                  f"{result[f'indexer_decode_b{b}_ms']:.3f} ms, {result[f'indexer_decode_b{b}_key_gbs']:.0f} GB/s of "
                  f"keys | {result[f'indexer_decode_b{b}_key_gbs'] / pc:.2f} of copy |")
    if "indexer_scores_ms" in result:
        print(f"| indexer scores | {result['indexer_scores_ms']:.3f} ms ({result['indexer_tflops']:.0f} TFLOP/s) "
              f"| {result['fp8_scaled_mm_same_gemm_ms'] / result['indexer_scores_ms']:.2f}x of FP8 scaled_mm "
              f"({result['fp8_scaled_mm_same_gemm_ms']:.3f} ms) |")
        print(f"| top-k 512 of 65536 x 4096 (exact kernel) | {result['topk_kernel_ms']:.3f} ms | |")
        print(f"| scores + top-k, chunked | {result['indexer_plus_topk_chunked_ms']:.3f} ms | |")


if __name__ == "__main__":
    main()
