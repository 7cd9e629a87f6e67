"""What the engine hands back: per-step deltas for streaming, and whole results for `generate`."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampler import TokenLogprob


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


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


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int] = field(repr=False)
    finish_reason: str
    usage: Usage
    timings: dict[str, float | None] = field(default_factory=dict, repr=False)
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)
    error: str | None = None
