"""Chunked prefill benchmark: the running streams' inter-token latency while a long prompt arrives.

    .venv/bin/python bench/chunked_prefill.py [--model smollm2] [--streams 4] [--long-tokens 4000]
                                              [--stream-tokens 96] [--budget N[,N...]] [--device cpu]

`--streams` greedy streams decode `--stream-tokens` tokens each. In the "alone" run nothing else
arrives; in the "long prompt" run a prompt of `--long-tokens` tokens arrives once the streams have
each produced a quarter of their tokens. Both runs are made twice in one process, on two engines of
the same weights: unchunked (the step's token budget holds the whole long prompt, so its prefill is
one step that every stream waits for) and chunked (at most `--budget` prompt tokens a step beside
the decodes, `max_prefill_beside_decodes`, the engine's default for the device unless given; several
comma-separated budgets make one chunked engine each, to compare them in one run). An inter-token
latency is the time between two successive tokens of one stream as the engine hands them out
(`Engine.step`); every stream's gaps are pooled. Every stream gets its token in the same step, so
the p99 of few steps is close to the worst step: read the p99 with the long prompt beside the
p50/max alone, not the ratio alone.

Printed per engine: ITL p50 / p99 / max alone and with the long prompt, the ratio of the p99s (the
issue's goal: within 2x, chunked), and the long prompt's time to first token (what chunking costs
it). The engine alone, no web; the device loop is off so every step hands each stream one token.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (no interpolation: p99 of few samples is one of them)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def run(engine: Engine, streams: int, stream_tokens: int, long_prompt: list[int] | None) -> tuple[list[float], float]:
    """The streams' pooled inter-token latencies (s) and the long prompt's time to first token (s; 0 alone)."""
    params = SamplingParams(max_tokens=stream_tokens, temperature=0, ignore_eos=True)
    for index in range(streams):
        engine.add_request(f"s{index}", f"Stream {index}: tell me about the history of the number {index}.", params)
    last: dict[str, float] = {}
    gaps: list[float] = []
    produced = 0
    arrived = first_token = 0.0
    while engine.has_unfinished_requests():
        if long_prompt is not None and not arrived and produced >= streams * stream_tokens // 4:
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
            arrived = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            if output.request_id == "long":
                first_token = first_token or (now if output.token_ids else 0.0)
                continue
            if output.token_ids:
                produced += len(output.token_ids)
                if output.request_id in last:
                    gaps.append(now - last[output.request_id])
                last[output.request_id] = now
    return gaps, (first_token - arrived if long_prompt is not None else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=96)
    parser.add_argument("--long-tokens", type=int, default=4000)
    parser.add_argument("--budget", default=None,
                        help="the chunked engines' max_prefill_beside_decodes, comma-separated (default: the "
                             "engine's for the device)")
    args = parser.parse_args()
    chunk_budgets = [int(b) for b in args.budget.split(",")] if args.budget else [None]
    whole = args.long_tokens + args.streams
    budgets = {"unchunked": whole}
    for budget in chunk_budgets:
        config = EngineConfig.from_env(model=args.model, device=args.device, max_prefill_beside_decodes=budget)
        beside = config.prefill_budget_beside_decodes or config.token_budget
        budgets[f"chunked {beside}"] = beside
    rows = {}
    for name, budget in budgets.items():
        engine = Engine(EngineConfig.from_env(model=args.model, device=args.device, max_num_batched_tokens=whole,
                                              max_prefill_beside_decodes=budget, device_loop=False))
        vocab = engine.loaded.config.vocab_size
        # Random ids: no prefix of it is cached, and no two runs share one.
        long_prompt = [random.Random(budget).randrange(100, vocab) for _ in range(args.long_tokens)]
        engine.generate(["warm up"], SamplingParams(max_tokens=4, temperature=0))
        alone, _ = run(engine, args.streams, args.stream_tokens, None)
        loaded, ttft = run(engine, args.streams, args.stream_tokens, long_prompt)
        rows[name] = (budget, alone, loaded, ttft)
    print(f"{args.streams} streams x {args.stream_tokens} tokens, a {args.long_tokens}-token prompt arriving "
          f"after a quarter of them; model {args.model}, device {args.device}")
    print(f"{'engine':13} {'budget':>6} {'ITL alone p50/p99/max ms':>26} {'with long prompt p50/p99/max ms':>33} "
          f"{'p99 ratio':>9} {'long TTFT s':>11}")
    for name, (budget, alone, loaded, ttft) in rows.items():
        a = [percentile(alone, q) * 1000 for q in (50, 99, 100)]
        b = [percentile(loaded, q) * 1000 for q in (50, 99, 100)]
        print(f"{name:13} {budget:6d} {a[0]:8.1f} {a[1]:8.1f} {a[2]:8.1f} {b[0]:10.1f} {b[1]:10.1f} {b[2]:11.1f} "
              f"{b[1] / a[1]:9.2f} {ttft:11.2f}")
    unchunked = rows.pop("unchunked")
    for name, chunked in rows.items():
        print(f"{name}: with the long prompt, ITL p99 unchunked / chunked: "
              f"{percentile(unchunked[2], 99) / percentile(chunked[2], 99):.1f}x; "
              f"chunked p99 with / alone: {percentile(chunked[2], 99) / percentile(chunked[1], 99):.2f} (goal <= 2); "
              f"long prompt TTFT chunked / unchunked: {chunked[3] / unchunked[3]:.2f}")


if __name__ == "__main__":
    main()
