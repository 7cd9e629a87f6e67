"""What asking for logprobs costs the engine: decode tokens/s of the same prompts with logprobs off,
`logprobs=0` and `logprobs=20`, in one run, alternating, each mode's median over --rounds.

A request with logprobs stays on the host decode path (no device-loop bursts) and adds a float64
log-softmax over the vocabulary per token; greedy rows without logprobs take the batched argmax.
Usage: python bench/logprobs_cost.py [--model demo] [--streams 8] [--tokens 64] [--rounds 3] [--device-loop]
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine import Engine, EngineConfig, SamplingParams

PROMPTS = ["The list type", "def parse(text):", "class Node:", "import os", "for i in range(10):",
           "A dictionary maps", "# Sort the items", "while True:"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-loop", action="store_true")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model=args.model, device_loop=args.device_loop))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.streams)]
    modes = {"off": None, "logprobs=0": 0, "logprobs=20": 20}
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    for _ in range(args.rounds):
        for mode, logprobs in modes.items():
            params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True, logprobs=logprobs)
            started = time.perf_counter()
            results = engine.generate(prompts, params)
            rates[mode].append(sum(r.usage.completion_tokens for r in results) / (time.perf_counter() - started))
    base = statistics.median(rates["off"])
    for mode, values in rates.items():
        median = statistics.median(values)
        print(f"{mode:12s} {median:8.1f} tokens/s  x{median / base:.2f} of off")


if __name__ == "__main__":
    main()
