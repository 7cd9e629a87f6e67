"""CPU time of one decode step (Engine.step) at one thread: the A/B measure for a busy shared machine.

    PYTHONPATH=. .venv/bin/python bench/decode_step_time.py --weights quantized --dtype bfloat16 --batches 1,8

Wall-clock tokens/s on a machine shared with other work measures mostly the load; the process's own CPU
time (time.process_time) around a run of decode steps at one thread moves much less with it. Per batch
size: `--batch` chat-templated prompts are prefilled and warmed up, then `--rounds` rounds of `--steps`
decode steps are timed; the minimum round is the figure (the one least disturbed), printed with the
load average. Compare two versions of the code by running this on each, one after the other, twice.
`--threads N` runs torch at N threads instead of 1 (CPU time then sums the threads). `--kernels` also
profiles one more round and prints the share of each of the costliest ops (torch.profiler self time),
which says how much of a step is the weight kernels and how much the small ops around them.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bench.engine_bench import QUESTIONS
from engine.engine import Engine
from engine.engine_config import EngineConfig
from engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="quantized")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", action="store_true", help="print the costliest ops' share of a step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine(EngineConfig(model=args.model, weights=args.weights, dtype=args.dtype))
    params = SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True)
    print(f"{args.model} {args.weights} {args.dtype}, {args.threads} thread(s), load average {os.getloadavg()}")
    for batch in (int(b) for b in args.batches.split(",")):
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for i, request_id in enumerate(ids):
            prompt = engine.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            engine.add_request(request_id, prompt, params)
        for _ in range(3):  # the prefill, then warm-up decodes
            engine.step()
        rounds = []
        for _ in range(args.rounds):
            start = time.process_time()
            for _ in range(args.steps):
                engine.step()
            rounds.append((time.process_time() - start) / args.steps)
        if args.kernels:
            print_kernel_shares(engine, args.steps)
        for request_id in ids:
            engine.abort(request_id)
        while engine.has_unfinished_requests():
            engine.step()
        best = min(rounds)
        print(f"batch {batch}: {best * 1e3:.2f} ms CPU a decode step (min of {args.rounds} rounds, median "
              f"{sorted(rounds)[len(rounds) // 2] * 1e3:.2f}), {batch / best:.1f} tok/s of decode by CPU time; "
              f"load average {os.getloadavg()[0]:.1f}")


def print_kernel_shares(engine: Engine, steps: int, top: int = 6) -> None:
    """The costliest ops of `steps` decode steps by self CPU time, each as a share of the total and in
    ms a step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            engine.step()
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    shares = ", ".join(f"{e.key} {100 * e.self_cpu_time_total / total:.0f}% "
                       f"({e.self_cpu_time_total / steps / 1e3:.2f} ms)" for e in events[:top])
    print(f"  profiled: {total / steps / 1e3:.2f} ms a step; {shares}")


if __name__ == "__main__":
    main()
