"""Generate from DeepSeek-V4.1 offline: the tiny random checkpoint by default, on the GPU if there is one.

    uv run runtime/examples/offline_inference.py                      # tiny-random/deepseek-v4.1-flash-1017
    uv run runtime/examples/offline_inference.py --model /path/to/checkpoint --max-tokens 64

The tiny checkpoint is generated locally on first use (nothing is downloaded); its weights are random, so the
tokens are meaningless: the run shows the engine working end to end and how fast it goes.
"""

from __future__ import annotations

import argparse
import time

import torch

from mini_deepinfer import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random/deepseek-v4.1-flash-1017")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    llm = LLM(args.model, max_model_len=1024, max_num_seqs=max(8, args.num_prompts), device=device,
              kv_cache_memory_gb=0.5)
    print(f"loaded {args.model} on {device} in {time.perf_counter() - start:.1f} s")

    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    lengths = [37 + 41 * i for i in range(args.num_prompts)]
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    params = [
        SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        if i % 2 == 0
        else SamplingParams(temperature=0.7, top_p=0.9, max_tokens=args.max_tokens, seq_seed=42 + i)
        for i in range(args.num_prompts)
    ]

    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start

    for prompt, out in zip(prompts, outputs):
        ttft = out.metrics.time_to_first_token
        print(f"[{out.request_id}] {len(prompt)} prompt tokens -> {out.token_ids} "
              f"({out.finish_reason}, first token after {ttft * 1000:.0f} ms)")
    n_in = sum(len(p) for p in prompts)
    n_out = sum(len(o.token_ids) for o in outputs)
    print(f"{n_in} prompt + {n_out} generated tokens in {elapsed:.2f} s: "
          f"{n_in / elapsed:.0f} prompt tok/s, {n_out / elapsed:.1f} output tok/s (first run, no warm-up)")


if __name__ == "__main__":
    main()
