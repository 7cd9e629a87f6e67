"""Multi-turn chat benchmark: prefix caching on vs off, side by side in one run (issue 18).

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


def conversation_turns(engine: Engine, users: int, turns: int, max_tokens: int) -> dict[str, list[float]]:
    """Runs every user's conversation; returns per turn the users' TTFTs, and the prefill counts."""
    tokenizer = engine.tokenizer
    histories = [[{"role": "system", "content": f"You are assistant number {u}. Answer briefly."}]
                 for u in range(users)]
    ttft: dict[str, list[float]] = {"prefilled": [0.0], "prompt": [0.0]}
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
        ttft[f"turn {turn + 1}"] = [r.timings["time_to_first_token"] or 0.0 for r in results]
        ttft["prefilled"][0] += sum(r.usage.prompt_tokens - r.usage.cached_tokens for r in results)
        ttft["prompt"][0] += sum(r.usage.prompt_tokens for r in results)
    return ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rows = {}
    for name, on in (("cache off", False), ("cache on", True)):
        engine = Engine(EngineConfig.from_env(model=args.model, device=args.device, prefix_caching=on))
        engine.generate(["warm up"], SamplingParams(max_tokens=2, temperature=0))
        started = time.perf_counter()
        figures = conversation_turns(engine, args.users, args.turns, args.max_tokens)
        first, last = mean(figures["turn 1"]), mean(figures[f"turn {args.turns}"])
        rows[name] = (first, last, figures["prefilled"][0], figures["prompt"][0], time.perf_counter() - started)
    print(f"{args.users} users x {args.turns} turns, {args.max_tokens} tokens a reply, model {args.model}, "
          f"device {args.device}")
    print(f"{'mode':10} {'TTFT turn 1':>12} {f'TTFT turn {args.turns}':>13} {'ratio':>6} {'prefilled':>10} "
          f"{'of prompt':>10} {'wall s':>7}")
    for name, (first, last, prefilled, prompt, wall) in rows.items():
        print(f"{name:10} {first * 1000:10.1f}ms {last * 1000:11.1f}ms {last / first:6.2f} {prefilled:10.0f} "
              f"{prompt:10.0f} {wall:7.1f}")
    off, on = rows["cache off"], rows["cache on"]
    print(f"prefill tokens computed, off / on: {off[2] / on[2]:.1f}x fewer with the cache")


if __name__ == "__main__":
    main()
