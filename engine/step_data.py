"""The data one engine step hands along: scheduler -> device loop -> runner -> engine, each frozen.

- `ScheduledBatch`, the scheduler's output: the sequences of this forward in row order, how many
  tokens each row feeds (a long prompt is prefilled in chunks over several steps; a row whose chunk
  ends short of its prompt samples nothing), those it finished as FinishedIgnored, and the burst it
  granted (`BurstGrant`). Every KV block the step may write, a burst's lookahead included, is in the
  rows' block tables before the batch exists: the runner never asks the scheduler for room.
- `StepPlan`, the device loop's decision for the batch (engine/decode/device_loop.py:DeviceLoop.plan): the
  parked token each row was served, and whether the other rows run the granted burst or the host forward.
- `RunnerOutput`, the runner's output: per row the token, its logprob record and where the token came
  from (`TokenSource`). The engine keeps the last one (`Engine.last_step`) for inspection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.sampler import TokenLogprob
from engine.sequence import Sequence


@dataclass(frozen=True)
class BurstGrant:
    """A device-loop burst: the decode-batch rows it serves and its steps per row. In a batch, the KV
    room for every step (positions len-1 .. len+steps-2 of each row) is already granted."""
    rows: tuple[int, ...]
    steps: int


@dataclass(frozen=True)
class ScheduledBatch:
    sequences: tuple[Sequence, ...] = ()  # each feeds token_ids[num_cached:][:feeds(row)]; its index is its row
    ignored: tuple[Sequence, ...] = ()    # newly FinishedIgnored, to report to clients
    burst: BurstGrant | None = None       # the lookahead granted for a burst; None: no burst this step
    chunks: tuple[int, ...] = ()          # per row, the tokens it feeds; (): every row feeds all it has

    def __bool__(self) -> bool:
        return bool(self.sequences)

    def feeds(self, row: int) -> int:
        """The tokens this row feeds this step (the whole uncached rest, unless its prefill is chunked)."""
        return self.chunks[row] if self.chunks else self.sequences[row].num_uncached

    def completes(self, row: int) -> bool:
        """Whether this row's forward reaches its last token, so its logits are sampled: false only
        for a chunk of a prefill that continues next step."""
        return self.feeds(row) == self.sequences[row].num_uncached


@dataclass(frozen=True)
class StepPlan:
    parked: tuple[int | None, ...]  # per row: the parked token it is served this step, or None
    burst: BurstGrant | None        # the rows left run this burst; None: they run the host forward

    @property
    def unserved(self) -> tuple[int, ...]:
        """The rows that need a burst or a forward."""
        return tuple(row for row, token in enumerate(self.parked) if token is None)


class TokenSource(enum.Enum):
    PARKED = "parked"  # drained from the row's parked slot: no launch this step
    BURST = "burst"    # the first token of a burst that ran this step
    HOST = "host"      # one forward and the sampler
    CHUNK = "chunk"    # a prefill chunk short of the prompt's end: fed, nothing sampled (token None)


@dataclass(frozen=True)
class RowOutput:
    seq_id: int
    token: int | None             # None only for a CHUNK row
    logprob: TokenLogprob | None  # None unless the row asks for logprobs or a confidence floor
    source: TokenSource
    # The prompt logprobs this forward produced for the row (engine/decode/prompt_logprobs.py), in order.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class RunnerOutput:
    rows: tuple[RowOutput, ...] = ()  # one per scheduled sequence, in row order; () when nothing ran

    def rows_by_seq_id(self) -> dict[int, int]:
        """Sequence id -> its row in this step's batch (the parked slot it reads)."""
        return {row.seq_id: index for index, row in enumerate(self.rows)}


NOTHING_RAN = RunnerOutput()
