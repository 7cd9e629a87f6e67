"""What streaming text costs per step as an output grows: IncrementalDetokenizer.update (the engine's, a
window of the newest tokens) beside a decode of the whole output (the simple way, whose cost grows with
the output), at several output lengths, in one run.

The output is the model's tokenizer's encoding of a long mixed text (ASCII, accents, CJK, emoji), fed
one token per step as a stream is; each figure is the mean per-step time over --steps steps taken at
that output length, the best of --rounds.
Usage: python bench/detokenize_cost.py [--model smollm2] [--lengths 256,1024,4096] [--stop STRING]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from engine.loading.model_files import load_tokenizer  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog; café naïve Ünïcödé, 你好世界, 😀🎉 and more text "
        "with numbers 12345 and code `def f(x): return x * 2`.\n")


def per_step_seconds(step: object, rounds: int, steps: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", default="256,1024,4096")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stop", default="STOP HERE", help="a stop string that never occurs (held-tail checks run)")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    lengths = [int(n) for n in args.lengths.split(",")]
    ids = tokenizer.encode(TEXT * 200, add_special_tokens=False)
    while len(ids) < max(lengths) + args.steps:
        ids += ids
    print(f"tokenizer of {args.model}; per-step microseconds, best of {args.rounds} rounds of {args.steps} steps")
    print(f"{'output tokens':>13} {'incremental':>12} {'whole decode':>13} {'ratio':>7}")
    for length in lengths:
        detok = IncrementalDetokenizer(tokenizer, (args.stop,))
        output = ids[:length]  # the sequence's output list, grown in place as the engine grows it
        detok.update(output, final=False)  # the stream so far, in one update

        def incremental() -> None:
            output.append(ids[len(output)])
            detok.update(output, final=False)

        def whole() -> None:
            tokenizer.decode(ids[: length + 1])
        ours, theirs = (per_step_seconds(f, args.rounds, args.steps) for f in (incremental, whole))
        print(f"{length:>13} {ours * 1e6:>12.1f} {theirs * 1e6:>13.1f} {theirs / ours:>6.1f}x")


if __name__ == "__main__":
    main()
