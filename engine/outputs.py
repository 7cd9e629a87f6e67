"""What the engine hands back: per-step deltas for streaming, and whole results for `generate`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.reproduce import ReproRecord
from engine.sampler import TokenLogprob
from engine.sequence import Timings


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        """The websocket API's `done.usage` (OpenAI's endpoints nest cached_tokens: workbench/api)."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "cached_tokens": self.cached_tokens}


@dataclass(frozen=True)
class RequestOutput:
    """One step's news for one request. Deltas concatenate: `index` is the offset of the first token
    in `token_ids` among all the request's output tokens, so a client can detect a gap."""
    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None   # stop | length | tool_calls | canceled | error
    error: str | None = None
    usage: Usage | None = None         # on the finishing delta
    timings: dict[str, float | None] | None = None  # on the finishing delta
    # On the finishing delta of a request that ran to its end (not canceled, not failed): what
    # re-deriving it needs (engine/reproduce.py).
    record: ReproRecord | None = None
    # On the first delta (index 0) when the request asks for prompt logprobs: the prompt's token ids and
    # a record per prompt token, the first None (nothing precedes it).
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int] = field(repr=False)
    finish_reason: str
    usage: Usage
    timings: dict[str, float | None] = field(default_factory=dict, repr=False)
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)
    error: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = field(default=None, repr=False)

    @classmethod
    def from_deltas(cls, deltas: list[RequestOutput]) -> "GenerationResult":
        """A whole request from its streamed deltas (the last one carries usage and timings)."""
        last = deltas[-1]
        if last.finish_reason is None or last.usage is None or last.timings is None:
            raise ValueError(f"request {last.request_id}: its last delta does not finish it")
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])] if last.logprobs is not None else None
        return cls(text="".join(d.text for d in deltas), token_ids=[t for d in deltas for t in d.token_ids],
                   finish_reason=last.finish_reason, usage=last.usage, timings=last.timings, logprobs=logprobs,
                   error=last.error, prompt_logprobs=deltas[0].prompt_logprobs)


def timings_of(t: Timings, output_tokens: int) -> dict[str, float | None]:
    """Queue time, time to first token, decode tokens/s and total time of a request, in seconds."""
    finished = t.finished or time.monotonic()
    decode_time = finished - t.first_token if t.first_token is not None else None
    decoded = output_tokens - 1
    return {
        "queue_time": None if t.first_scheduled is None else t.first_scheduled - t.arrival,
        "time_to_first_token": None if t.first_token is None else t.first_token - t.arrival,
        "decode_tokens_per_s": decoded / decode_time if decode_time and decoded > 0 else None,
        "total_time": finished - t.arrival,
    }
