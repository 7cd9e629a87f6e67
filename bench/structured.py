"""Structured output's cost: decode tokens/s with a json_schema constraint vs without, same prompts, one run.

    .venv/bin/python bench/structured.py [--model smollm2] [--requests 8] [--max-tokens 48] [--rounds 3]

Each round runs the same batch of chat prompts twice on one engine, each run first every other round,
so the machine's load drifts over both alike (a warm-up pair first): once under a JSON Schema
(engine/grammar.py's token mask per row), greedy, each request ending where its JSON ends; then
unconstrained, greedy with EOS ignored and each request's max_tokens set to the count its constrained
warm-up made, so both runs make the same tokens per request and their batches shrink alike. Prints both
rates, the ratio (goal: constrained at most 10% slower, ratio >= 0.9) and
the mask's share of a constrained step (time in Constraint.apply / advance).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine import grammar  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "hobbies": {"type": "array", "items": {"type": "string"}}}}
QUESTIONS = ["Invent a person and describe them in JSON.", "Describe a fictional neighbour as JSON.",
             "Give me a JSON profile of a made-up teacher.", "Write a JSON record for an imaginary chef."]


class MaskClock:
    """Seconds spent in the grammar (mask and advance), by wrapping Constraint's two calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        for name in ("apply", "advance"):
            original = getattr(grammar.Constraint, name)
            setattr(grammar.Constraint, name, self._timed(original))

    def _timed(self, original):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
        ) -> tuple[list[int], float]:
    """Each request's token count and the wall time of the batch."""
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    return [len(r.token_ids) for r in results], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = Engine(EngineConfig(model=args.model, max_model_len=1024))
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
               for i in range(args.requests)]
    constrained = SamplingParams(max_tokens=args.max_tokens, temperature=0,
                                 response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    # Warm-up, which also gives each request's token count (greedy: the same every run). The grammar
    # tokenizer is built on first use.
    counts, _ = run(engine, prompts, constrained)
    # The free run makes exactly as many tokens per request as the constrained one, so both batches
    # shrink alike as requests end and the KV lengths match: only the mask differs.
    free = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in counts]
    run(engine, prompts, free)
    clock = MaskClock()
    totals: dict[str, list[float]] = {"free": [0, 0.0], "json_schema": [0, 0.0]}
    runs: list[tuple[str, SamplingParams | list[SamplingParams]]] = [("json_schema", constrained), ("free", free)]
    for round_ in range(args.rounds):
        for name, params in runs if round_ % 2 == 0 else runs[::-1]:  # each goes first every other round
            made, seconds = run(engine, prompts, params)
            totals[name][0] += sum(made)
            totals[name][1] += seconds
    rates = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    print(f"model {args.model}, {args.requests} requests per batch, max_tokens {args.max_tokens}, "
          f"{args.rounds} rounds, engine device {engine.loaded.device}")
    for name, (tokens, seconds) in totals.items():
        print(f"  {name:12s} {int(tokens):6d} tokens in {seconds:7.2f} s = {rates[name]:8.1f} tokens/s")
    print(f"  ratio json_schema / free = {rates['json_schema'] / rates['free']:.3f} (goal >= 0.90)")
    print(f"  grammar (mask + advance): {clock.seconds:.2f} s = "
          f"{100 * clock.seconds / totals['json_schema'][1]:.1f}% of the constrained runs' time")


if __name__ == "__main__":
    main()
