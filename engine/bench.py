"""`python -m engine bench`: our generation throughput against HF transformers on the same weights.

Both sides load the same directory, run greedy decoding of the same prompts for the same number of
new tokens (EOS ignored, so both generate exactly that many), at batch 1 and batch 8, in one process,
one after the other. Each measurement is the median of `--repeats` timed runs after a warm-up.
Ours runs twice: host decode, and with the device decode loop (bursts of `--burst-length` steps).
Printed: tokens/s for each, the loop's ratio over host decode and our ratios over HF. transformers is
needed for this command only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.sampling_params import SamplingParams

PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
           "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="demo")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--burst-length", type=int, default=8)


def _median_seconds(run, repeats: int) -> float:
    run()  # warm-up: first-call allocations and kernel selection are not what we measure
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_bench(args: argparse.Namespace) -> int:
    try:
        import transformers
    except ImportError:
        print("error: the bench compares against HF transformers: pip install -e '.[test]'", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(EngineConfig(model=args.model, device_loop=False))
    looped = Engine(EngineConfig(model=args.model, device_loop=True, burst_length=args.burst_length))
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like our ignore_eos: every step decodes, none is forbidden
    tokenizer = engine.tokenizer
    pad = tokenizer.token_id(tokenizer.eos_token) if tokenizer.eos_token else 0
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    print(f"model {args.model}: {sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M parameters, "
          f"{args.max_tokens} new tokens per prompt, greedy, torch threads {torch.get_num_threads()}")
    print(f"{'batch':>5} {'host tok/s':>11} {'loop tok/s':>11} {'HF tok/s':>9} {'loop/host':>10} "
          f"{'host/HF':>8} {'loop/HF':>8}")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        encoded = [tokenizer.encode(p) for p in prompts]
        width = max(map(len, encoded))
        # HF batches by left padding with an attention mask, as its docs recommend for decoder-only models.
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])

        def ours(on: Engine = engine):
            results = on.generate(prompts, params)
            assert all(len(r.token_ids) == args.max_tokens for r in results)

        @torch.no_grad()
        def theirs():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=args.max_tokens, do_sample=False,
                              pad_token_id=pad)
            assert out.shape[1] - width == args.max_tokens

        tokens = batch * args.max_tokens
        host = tokens / _median_seconds(ours, args.repeats)
        loop = tokens / _median_seconds(lambda: ours(looped), args.repeats)
        hf_rate = tokens / _median_seconds(theirs, args.repeats)
        print(f"{batch:>5} {host:>11.1f} {loop:>11.1f} {hf_rate:>9.1f} {loop / host:>9.2f}x "
              f"{host / hf_rate:>7.2f}x {loop / hf_rate:>7.2f}x", flush=True)
    return 0
