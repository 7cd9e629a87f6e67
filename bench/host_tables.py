"""The per-step block table built on the host, three ways side by side at decode batch shapes: padded
nested lists through torch.tensor (the oldest code), engine/kernels/host_copy.py:padded_rows (numpy
row writes, what a step with a prefill builds for the native CPU op), and
engine/decode/block_table.py:DeviceBlockTable (what a decode step takes: only the rows that changed
since the last step rewritten, then a copy of the table).

Every step builds its batch's block tables from the sequences' lists, so at long contexts this is host
time in every step. In the in-place column each step one row in 16 gains a block, as in a decode batch
with 16-token blocks. Medians of --repeats builds, in milliseconds, and the ratios (how many times faster).
Usage: python bench/host_tables.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.decode.block_table import DeviceBlockTable  # noqa: E402
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
    print(f"{'rows':>5} {'blocks':>6} {'lists ms':>9} {'numpy ms':>9} {'in place ms':>12} {'lists/numpy':>12} "
          f"{'numpy/in place':>15}")
    for rows, tokens in SHAPES:
        # Uneven lengths up to the context, each sequence's blocks scattered over the pool.
        tables = [list(range(row, row + 7 * (tokens // 16 - row % 5), 7)) for row in range(rows)]
        width = max(len(t) for t in tables) + 1  # room for the blocks the in-place steps add
        lists = median_ms(lambda: torch.tensor([t + t[-1:] * (width - len(t)) for t in tables]), repeats)
        numpy = median_ms(lambda: padded_rows(tables, width), repeats)
        in_place = median_ms(in_place_steps(tables, width), repeats)
        print(f"{rows:>5} {width:>6} {lists:>9.3f} {numpy:>9.3f} {in_place:>12.3f} {lists / numpy:>11.1f}x "
              f"{numpy / in_place:>14.1f}x")


def in_place_steps(tables: list[list[int]], width: int):
    """One decode step's table each call; every 16th call per row, that row gains a block (and a row
    that gained one gives it back later, so the width holds)."""
    table = DeviceBlockTable(len(tables), width, pad=0, device=torch.device("cpu"))
    table.table(tables, len(tables), width)
    calls = itertools.count()

    def step() -> None:
        row = next(calls) % (16 * len(tables))
        if row < len(tables) and len(tables[row]) < width:
            tables[row].append(tables[row][-1] + 7)
        elif row < len(tables):
            tables[row].pop()
        table.table(tables, len(tables), width)
    return step


if __name__ == "__main__":
    main()
