"""The per-step block tables built on the host (engine/kernels/host_copy.py:padded_rows): every row's own
blocks in order, then its padding, whatever the rows' lengths, against the padded lists they stand for.

Here rather than in tests/kernels, which bench/gpu_check.sh collects on the GPU machine: the first hypothesis
test collected in a fresh checkout scans the project's sources for constants (hypothesis's constants_ast),
about 8 s of that collect step's 25."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels.host_copy import device_tensor, padded_rows

TABLES = st.lists(st.lists(st.integers(0, 2**40), min_size=1, max_size=12), min_size=1, max_size=9)


@settings(max_examples=150, deadline=None)
@given(tables=TABLES, extra_width=st.integers(0, 5), extra_rows=st.integers(0, 4), pad=st.integers(0, 99))
def test_rows_padded_with_the_pad_block_and_pad_rows_below(tables, extra_width, extra_rows, pad):
    width = max(len(t) for t in tables) + extra_width
    expected = [t + [pad] * (width - len(t)) for t in tables] + [[pad] * width] * extra_rows
    got = padded_rows(tables, width, pad=pad, height=len(tables) + extra_rows)
    assert got.dtype == torch.long and got.tolist() == expected


@settings(max_examples=150, deadline=None)
@given(tables=TABLES, extra_width=st.integers(0, 5))
def test_rows_padded_with_their_own_last_block(tables, extra_width):
    """A row never points at a block it does not hold, not even in its padding."""
    width = max(len(t) for t in tables) + extra_width
    got = padded_rows(tables, width)
    assert got.tolist() == [t + t[-1:] * (width - len(t)) for t in tables]
    assert device_tensor(got, torch.device("cpu")).tolist() == got.tolist()


def test_each_call_builds_a_table_of_its_own():
    """The tables go to the device by a non-blocking copy: a later step's table must not write into the
    memory an earlier one was copied from."""
    first = padded_rows([[1, 2]], 3, pad=0)
    padded_rows([[7, 8, 9]], 3, pad=0)
    assert first.tolist() == [[1, 2, 0]]
