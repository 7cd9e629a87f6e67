"""The per-step block table built on the host: padded nested lists through torch.tensor against
engine/kernels/host_copy.py:padded_rows (numpy row writes), side by side, at decode batch shapes.

Every step builds its batch's block tables from the sequences' lists (a step of decodes only one: the
decode graphs' padded table; a step with a prefill two: the native CPU op's and the decodes'), so at long
contexts this is host time in every step. Medians of --repeats builds, in milliseconds, and the ratio.
Usage: python bench/host_tables.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.host_copy import padded_rows  # noqa: E402

# (rows, tokens per sequence): a block holds 16 tokens.
SHAPES = ((8, 512), (32, 2048), (64, 2048), (64, 8192))


def median_ms(build, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    repeats = parser.parse_args().repeats
    print(f"{'rows':>5} {'blocks':>6} {'lists ms':>9} {'numpy ms':>9} {'ratio':>6}")
    for rows, tokens in SHAPES:
        # Uneven lengths up to the context, each sequence's blocks scattered over the pool.
        tables = [list(range(row, row + 7 * (tokens // 16 - row % 5), 7)) for row in range(rows)]
        width = max(len(t) for t in tables)
        lists = median_ms(lambda: torch.tensor([t + t[-1:] * (width - len(t)) for t in tables]), repeats)
        numpy = median_ms(lambda: padded_rows(tables, width), repeats)
        print(f"{rows:>5} {width:>6} {lists:>9.3f} {numpy:>9.3f} {lists / numpy:>5.1f}x")


if __name__ == "__main__":
    main()
