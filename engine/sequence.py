"""Sequence, its states, and the set_state funnel that every state change passes.

The funnel exists for one guarantee: whatever takes a sequence out of the running set (a finish, an
abort, an error, an eviction, a preemption, a swap) stands the device loop down for it, so no token
it parked can outlive it and land in another user's response. `set_state` is therefore the only
writer of `Sequence.state`, and it is an exhaustive `match`: a new state variant fails the type check
(`assert_never`) until someone decides whether it stands the loop down.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable, Union, assert_never

from engine.sampling_params import SamplingParams


class StopReason(enum.Enum):
    EOS = "eos"
    STOP_TOKEN = "stop_token"
    STOP_STRING = "stop_string"
    LENGTH = "length"
    MODEL_LENGTH = "model_length"
    TOOL_CALLS = "tool_calls"
    LOW_CONFIDENCE = "low_confidence"
    CANCELED = "canceled"

    @property
    def finish_reason(self) -> str:
        """The wire value (OpenAI's, plus "canceled")."""
        match self:
            case StopReason.EOS | StopReason.STOP_TOKEN | StopReason.STOP_STRING | StopReason.LOW_CONFIDENCE:
                return "stop"
            case StopReason.LENGTH | StopReason.MODEL_LENGTH:
                return "length"
            case StopReason.TOOL_CALLS:
                return "tool_calls"
            case StopReason.CANCELED:
                return "canceled"
            case _:
                assert_never(self)


@dataclass(frozen=True)
class Waiting:
    """Queued for (re)prefill: new, or preempted by recompute."""


@dataclass(frozen=True)
class RunningPrompt:
    """Scheduled for its prefill this step."""


@dataclass(frozen=True)
class RunningCompletion:
    """Decoding."""


@dataclass(frozen=True)
class Swapped:
    """Preempted with its KV blocks copied to host memory."""


@dataclass(frozen=True)
class Done:
    reason: StopReason


@dataclass(frozen=True)
class Error:
    message: str


@dataclass(frozen=True)
class FinishedAborted:
    """Aborted by its client or the operator."""


@dataclass(frozen=True)
class FinishedIgnored:
    """Can never run here (its prompt does not fit the KV pool); the message says why."""
    message: str


SequenceState = Union[Waiting, RunningPrompt, RunningCompletion, Swapped, Done, Error, FinishedAborted,
                      FinishedIgnored]
StandDown = Callable[["Sequence"], None]


@dataclass
class Timings:
    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


class Sequence:
    def __init__(self, seq_id: int, request_id: str, prompt_ids: list[int], params: SamplingParams,
                 stand_down: StandDown, cache_scope: str = "") -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.logprobs: list = []  # TokenLogprob per output token, when the request asks for them
        # TokenLogprob per prompt token from the second on, when the request asks for prompt logprobs;
        # filled chunk by chunk as the prefill feeds them (engine/decode/prompt_logprobs.py).
        self.prompt_logprobs: list = []
        self.params = params
        self.block_table: list[int] = []
        self.num_cached = 0  # tokens whose keys/values are in this sequence's blocks
        # Prefix caching (engine/scheduler/block_pool.py): whose cached blocks this sequence may find and add to,
        # the chained hashes of its full blocks so far, how many of its blocks are already named by
        # theirs, and the prompt tokens its first admission found cached (None until admitted).
        self.cache_scope = cache_scope
        self.block_hashes: list[bytes] = []
        self.num_registered = 0
        self.cached_tokens: int | None = None
        self.timings = Timings()
        self._stand_down = stand_down
        self._state: SequenceState = Waiting()

    @property
    def state(self) -> SequenceState:
        return self._state

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def uncached_tokens(self) -> list[int]:
        """The tokens the next forward must feed (a decode touches only the output's tail)."""
        if self.num_cached >= len(self.prompt_ids):
            return self.output_ids[self.num_cached - len(self.prompt_ids):]
        return self.token_ids[self.num_cached:]

    @property
    def num_uncached(self) -> int:
        """Tokens the next forward must feed: the whole prompt for a prefill, 1 for a decode."""
        return self.num_tokens - self.num_cached

    @property
    def wants_prompt_logits(self) -> bool:
        """Whether a prefill must still produce logits at prompt positions for this sequence's prompt
        logprobs (so its prefix must be computed, not taken from the prefix cache)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1

    @property
    def is_finished(self) -> bool:
        return isinstance(self._state, (Done, Error, FinishedAborted, FinishedIgnored))

    def set_state(self, new: SequenceState) -> None:
        """The only writer of `state`. Every state outside the running set stands the device loop
        down for this sequence (drop its parked tokens, clear eligibility, bump the generation)."""
        self._state = new
        match new:
            case RunningPrompt() | RunningCompletion():
                pass
            case Waiting() | Swapped():
                # Preemption: the sequence will prefill again (or resume from host memory); anything
                # parked for it belongs to a KV state that no longer exists.
                self._stand_down(self)
            case Done() | Error() | FinishedAborted() | FinishedIgnored():
                if self.timings.finished is None:
                    self.timings.finished = time.monotonic()
                self._stand_down(self)
            case _:
                assert_never(new)

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, {self.request_id!r}, {self._state}, {len(self.output_ids)} out)"
