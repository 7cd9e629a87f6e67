"""The decode batch's block table updated in place (engine/decode/block_table.py): whatever the scheduler
does to its lists between steps (a block appended, a table cut short or replaced, rows reordered,
sequences joining and leaving), each step's table equals the one built afresh by padded_rows, so no row
ever points at a block its sequence does not hold; and a step writes only the rows that changed."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.decode.block_table import DeviceBlockTable
from engine.kernels.host_copy import padded_rows

PAD = 99
CPU = torch.device("cpu")
BLOCK = st.integers(0, 40)
# What the scheduler does to the batch's lists between two steps; the lists themselves change in place.
CHANGE = st.one_of(
    st.tuples(st.just("grow"), st.integers(0, 7), BLOCK),
    st.tuples(st.just("cut"), st.integers(0, 7), st.integers(1, 5)),
    st.tuples(st.just("replace"), st.integers(0, 7), st.lists(BLOCK, min_size=1, max_size=6)),
    st.tuples(st.just("swap"), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("join"), st.lists(BLOCK, min_size=1, max_size=6), st.just(0)),
    st.tuples(st.just("leave"), st.integers(0, 7), st.just(0)),
)


def apply(live: list[list[int]], change: tuple) -> None:
    kind, a, b = change
    if kind == "join" and len(live) < 6:
        live.append(list(a))
    elif kind == "leave" and len(live) > 1:
        live.pop(a % len(live))
    elif kind == "grow":
        live[a % len(live)].append(b)
    elif kind == "cut":
        del live[a % len(live)][b:]  # in place: the remembered row must be a copy
    elif kind == "replace":
        live[a % len(live)][:] = b
    elif kind == "swap":
        i, j = a % len(live), b % len(live)
        live[i], live[j] = live[j], live[i]


@settings(max_examples=200, deadline=None)
@given(first=st.lists(st.lists(BLOCK, min_size=1, max_size=6), min_size=1, max_size=6),
       steps=st.lists(st.tuples(CHANGE, st.integers(0, 2), st.integers(0, 3)), max_size=25))
def test_every_step_equals_the_table_built_afresh(first, steps):
    table = DeviceBlockTable(rows=8, blocks=10, pad=PAD, device=CPU)
    live = [list(t) for t in first]
    for change, extra_rows, extra_width in [((None, 0, 0), 0, 0), *steps]:
        apply(live, change)
        height, width = len(live) + extra_rows, max(len(t) for t in live) + extra_width
        expected = padded_rows(live, width, pad=PAD, height=height)
        assert table.table(live, height, width).tolist() == expected.tolist()


def test_a_step_writes_only_the_rows_that_changed():
    table = DeviceBlockTable(rows=8, blocks=16, pad=PAD, device=CPU)
    live = [[row * 10 + b for b in range(4)] for row in range(6)]
    table.table(live, 8, 8)
    assert table.rows_written == 6  # every row once; the pad rows below already were pad
    table.table(live, 8, 8)
    assert table.rows_written == 6
    live[3].append(77)
    assert table.table(live, 8, 8)[3].tolist() == [30, 31, 32, 33, 77, PAD, PAD, PAD]
    assert table.rows_written == 7


def test_a_list_cut_short_in_place_loses_its_blocks():
    """The scheduler's lists change in place: what a row remembers must be a copy, or a list cut short
    would look unchanged and its freed blocks (another sequence's next) stay in the row."""
    table = DeviceBlockTable(rows=2, blocks=4, pad=PAD, device=CPU)
    table.table([[1, 2, 3]], 1, 4)
    blocks = [4, 5, 6]
    table.table([blocks], 1, 4)  # not a continuation of [1, 2, 3]: the row is rewritten
    del blocks[1:]
    assert table.table([blocks], 1, 4).tolist() == [[4, PAD, PAD, PAD]]


def test_a_table_handed_out_stays_as_it_was():
    """A batch keeps its table for a whole burst while later steps rewrite the rows it came from."""
    table = DeviceBlockTable(rows=4, blocks=4, pad=PAD, device=CPU)
    earlier = table.table([[1, 2, 3, 4]], 1, 4)  # full rows: a view of them would be contiguous
    table.table([[5, 6, 7, 8]], 1, 4)
    assert earlier.tolist() == [[1, 2, 3, 4]]


def test_tables_past_its_size_are_built_afresh():
    table = DeviceBlockTable(rows=2, blocks=3, pad=PAD, device=CPU)
    wide, tall = [[1, 2, 3, 4, 5]], [[1], [2], [3]]
    assert table.table(wide, 2, 5).tolist() == padded_rows(wide, 5, pad=PAD, height=2).tolist()
    assert table.table(tall, 4, 2).tolist() == padded_rows(tall, 2, pad=PAD, height=4).tolist()
    assert table.rows_written == 0
