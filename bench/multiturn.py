"""Multi-turn chat benchmark: prefix caching on vs off, side by side in one run.

    .venv/bin/python bench/multiturn.py [--model smollm2] [--users 8] [--turns 10] [--max-tokens 32]
                                        [--device cpu]

Each of `--users` users holds a `--turns`-turn conversation: every turn sends the whole conversation
again through the model's chat template (as the chat page and OpenAI clients do), the users' turns
arriving together, greedy. Each user is its own cache scope, so no user's turn can hit another's.
Reported per mode: mean time to first token of turn 1 and of the last turn, their ratio, and the
prompt tokens prefilled (computed: prompt tokens minus those found cached) over the whole run. The
engine alone (no web): what the cache changes is prefill work, which a serving layer only adds to.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.outputs import GenerationResult  # noqa: E402

QUESTIONS = ["What does the list type do in Python?", "How would I sort it in reverse?",
             "And how do I remove duplicates but keep the order?", "What is a generator?",
             "Show a generator that yields squares.", "How is that different from a list comprehension?",
             "What does functools.lru_cache do?", "When should I not use it?", "What is a dataclass?",
             "Give a dataclass with a default list field."]


@dataclass
class Run:
    ttft: list[list[float]] = field(default_factory=list)  # per turn, each user's time to first token
    prompt_tokens: int = 0
    prefilled: int = 0  # prompt tokens computed: those not found in the prefix cache


def conversations(engine: Engine, users: int, turns: int, max_tokens: int) -> Run:
    """Every user's conversation, the users' turns arriving together."""
    tokenizer, run = engine.tokenizer, Run()
    histories = [[{"role": "system", "content": f"You are assistant number {u}. Answer briefly."}]
                 for u in range(users)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for turn in range(turns):
        deltas: dict[str, list] = {}
        for user, history in enumerate(histories):
            history.append({"role": "user", "content": QUESTIONS[(turn + user) % len(QUESTIONS)]})
            request_id = f"u{user}-t{turn}"
            deltas[request_id] = []
            engine.add_request(request_id, tokenizer.encode_chat(history), params, cache_scope=f"user-{user}")
        while engine.has_unfinished_requests():
            for output in engine.step():
                deltas[output.request_id].append(output)
        results = [GenerationResult.from_deltas(deltas[f"u{user}-t{turn}"]) for user in range(users)]
        for history, result in zip(histories, results):
            history.append({"role": "assistant", "content": result.text})
        run.ttft.append([r.timings["time_to_first_token"] or 0.0 for r in results])
        run.prompt_tokens += sum(r.usage.prompt_tokens for r in results)
        run.prefilled += sum(r.usage.prompt_tokens - r.usage.cached_tokens for r in results)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    runs, walls = {}, {}
    for name, on in (("cache off", False), ("cache on", True)):
        engine = Engine(EngineConfig.from_env(model=args.model, device=args.device, prefix_caching=on))
        engine.generate(["warm up"], SamplingParams(max_tokens=2, temperature=0))
        started = time.perf_counter()
        runs[name] = conversations(engine, args.users, args.turns, args.max_tokens)
        walls[name] = time.perf_counter() - started
    print(f"{args.users} users x {args.turns} turns, {args.max_tokens} tokens a reply, model {args.model}, "
          f"device {args.device}")
    print(f"{'mode':10} {'TTFT turn 1':>12} {f'TTFT turn {args.turns}':>13} {'ratio':>6} {'prefilled':>10} "
          f"{'of prompt':>10} {'wall s':>7}")
    for name, run in runs.items():
        first, last = mean(run.ttft[0]), mean(run.ttft[-1])
        print(f"{name:10} {first * 1000:10.1f}ms {last * 1000:11.1f}ms {last / first:6.2f} {run.prefilled:10d} "
              f"{run.prompt_tokens:10d} {walls[name]:7.1f}")
    print(f"prefill tokens computed, off / on: {runs['cache off'].prefilled / runs['cache on'].prefilled:.1f}x "
          "fewer with the cache")


if __name__ == "__main__":
    main()
