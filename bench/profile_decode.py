"""Where one decode step's time goes: torch.profiler over our engine's decode steps on a model.

    PYTHONPATH=. .venv/bin/python bench/profile_decode.py --model smollm2 --weights quantized --dtype bfloat16

Prefills `--batch` chat-templated prompts, runs a few decode steps as a warm-up, then profiles
`--steps` decode steps (Engine.step) and prints the ops with the most self CPU time, per step.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.engine_bench import QUESTIONS
from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="quantized")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    engine = Engine(EngineConfig.from_env(model=args.model, weights=args.weights, dtype=args.dtype))
    params = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    for i in range(args.batch):
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(4):  # the prefill, then decode steps as a warm-up
        engine.step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    wall = (time.perf_counter() - start) / args.steps
    print(f"{args.weights} {args.dtype}, batch {args.batch}: {wall * 1e3:.1f} ms per decode step under the "
          f"profiler ({args.batch / wall:.1f} tok/s)")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
    print(table)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
