"""`python -m engine bench`: our generation throughput against HF transformers on the same weights.

Both sides load the same directory, run greedy decoding of the same prompts for the same number of
new tokens (EOS ignored, so both generate exactly that many), at batch 1 and batch 8, in one process,
one after the other. Each measurement is the median of `--repeats` timed runs after a warm-up.
Ours runs in four modes: host decode, the device decode loop (bursts of `--burst-length` steps),
captured decode graphs (the CPU replay backend here), and both. Printed per batch size: tokens/s of
each, each mode's ratio over host decode and over HF. transformers is needed for this command only.
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
    modes = {name: Engine(EngineConfig(model=args.model, device_loop=loop, graphs=graphs, burst_length=args.burst_length))
             for name, loop, graphs in (("host", False, False), ("loop", True, False), ("graphs", False, True),
                                        ("graphs+loop", True, True))}
    engine = modes["host"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like our ignore_eos: every step decodes, none is forbidden
    tokenizer = engine.tokenizer
    pad = tokenizer.token_id(tokenizer.eos_token) if tokenizer.eos_token else 0
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    print(f"model {args.model}: {sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M parameters, "
          f"{args.max_tokens} new tokens per prompt, greedy, torch threads {torch.get_num_threads()}")
    print(f"{'batch':>5} {'mode':>12} {'tok/s':>9} {'vs host':>8} {'vs HF':>7}")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        encoded = [tokenizer.encode(p) for p in prompts]
        width = max(map(len, encoded))
        # HF batches by left padding with an attention mask, as its docs recommend for decoder-only models.
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])

        def ours(on: Engine):
            results = on.generate(prompts, params)
            assert all(len(r.token_ids) == args.max_tokens for r in results)

        @torch.no_grad()
        def theirs():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=args.max_tokens, do_sample=False,
                              pad_token_id=pad)
            assert out.shape[1] - width == args.max_tokens

        tokens = batch * args.max_tokens
        hf_rate = tokens / _median_seconds(theirs, args.repeats)
        print(f"{batch:>5} {'HF':>12} {hf_rate:>9.1f}", flush=True)
        host = None
        for name, on in modes.items():
            rate = tokens / _median_seconds(lambda: ours(on), args.repeats)
            host = host or rate
            print(f"{batch:>5} {name:>12} {rate:>9.1f} {rate / host:>7.2f}x {rate / hf_rate:>6.2f}x", flush=True)
    return 0
