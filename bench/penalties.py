"""A decode step's sampling with penalties: each request's PenaltyHistory kept from step to step against a
history rebuilt from the whole token lists every step, side by side, on the CPU.

Rows of sampled requests (temperature 0.8, seeded) with --prompt-tokens of prompt each, over --steps steps
after --warm output tokens, SmolLM2's vocabulary size. Median milliseconds of `sample` per step, and the
ratio. The tokens drawn are checked to be the same both ways.
Usage: python bench/penalties.py [--rows 32] [--prompt-tokens 2000] [--steps 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.sampler import PenaltyHistory, SampleRequest, sample  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

VOCAB = 49152
PARAMS = {"repetition": SamplingParams(temperature=0.8, seed=1, repetition_penalty=1.1),
          "frequency+presence": SamplingParams(temperature=0.8, seed=1, frequency_penalty=0.3, presence_penalty=0.2)}


def run(params: SamplingParams, rows: int, prompt_tokens: int, warm: int, steps: int,
        kept: bool) -> tuple[list[float], list[list[int]]]:
    """Per-step milliseconds and each row's tokens, with the histories kept (or rebuilt each step)."""
    picks = random.Random(0)
    prompts = [[picks.randrange(VOCAB) for _ in range(prompt_tokens)] for _ in range(rows)]
    outputs = [[picks.randrange(VOCAB) for _ in range(warm)] for _ in range(rows)]
    generators = [torch.Generator().manual_seed(row) for row in range(rows)]
    histories = [PenaltyHistory() if kept else None for _ in range(rows)]
    logits = torch.randn(steps, rows, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    times = []
    for step in range(steps):
        requests = [SampleRequest(params, prompts[r], outputs[r], generators[r], history=histories[r])
                    for r in range(rows)]
        start = time.perf_counter()
        tokens, _ = sample(logits[step], requests)
        times.append((time.perf_counter() - start) * 1e3)
        for output, token in zip(outputs, tokens):
            output.append(token)
    return times, outputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=100, help="output tokens before the timed steps")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"{args.rows} rows, {args.prompt_tokens}-token prompts, {args.warm} tokens out, {args.steps} steps, "
          f"{torch.get_num_threads()} threads")
    print(f"{'penalties':<19} {'rebuilt ms':>10} {'kept ms':>8} {'ratio':>6}")
    for name, params in PARAMS.items():
        rebuilt, rebuilt_tokens = run(params, args.rows, args.prompt_tokens, args.warm, args.steps, kept=False)
        kept, kept_tokens = run(params, args.rows, args.prompt_tokens, args.warm, args.steps, kept=True)
        assert kept_tokens == rebuilt_tokens, "the kept histories drew other tokens"
        before, after = statistics.median(rebuilt), statistics.median(kept)
        print(f"{name:<19} {before:>10.2f} {after:>8.2f} {before / after:>5.1f}x")


if __name__ == "__main__":
    main()
