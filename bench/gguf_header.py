"""What reading a GGUF file's header costs: ours (engine/loading/gguf_file.py) beside the gguf package's
GGUFReader, on the packaged models, in one run. The header is most of a load's fixed cost where the
vocabulary is large (Gemma 3: 262,144 pieces). Each figure is the best of --rounds.
Usage: python bench/gguf_header.py [--models smollm2,gemma3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loading.gguf_file import GGUFFile  # noqa: E402
from engine.loading.packaged_models import fetch  # noqa: E402


def best_of(rounds: int, read, path: Path) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        read(path)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    import gguf

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':10} {'ours':>8} {'gguf':>8} {'gguf/ours':>10}")
    for name in args.models.split(","):
        path = fetch(name)  # from the cache, or the package registry the first time
        ours, theirs = best_of(args.rounds, GGUFFile, path), best_of(args.rounds, gguf.GGUFReader, path)
        print(f"{name:10} {ours:7.2f}s {theirs:7.2f}s {theirs / ours:9.0f}x")


if __name__ == "__main__":
    main()
