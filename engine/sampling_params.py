"""SamplingParams: what a request asks of generation, checked on construction.

Each invalid value raises `InvalidSamplingParams` naming the parameter, so the API layers can return
it to the client as is. `SamplingParams.from_dict` also refuses parameters it does not know, because
a misspelt option silently ignored is a wrong answer the client cannot see.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from engine.response_format import ResponseFormatError, grammar_of

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_TOP_LOGPROBS = 20


class InvalidSamplingParams(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


def is_integer(value: object) -> TypeGuard[int]:
    """A JSON integer: an int, not a bool (True is an int to Python, never a count to a client), not a float."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 16       # None: as many as the model's length leaves after the prompt
    temperature: float = 1.0
    top_k: int = 0              # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # HF style, over prompt and output tokens; 1.0: off
    frequency_penalty: float = 0.0    # OpenAI style, over output tokens
    presence_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None       # None: none; N: the sampled token's logprob and the top N
    # vLLM's extension: None: none; N: each prompt token's logprob under the model (the first has none)
    # and the top N, from the prefill's logits (engine/decode/prompt_logprobs.py).
    prompt_logprobs: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # The first this many tokens are never EOS (unless ignore_eos) or a stop token: the sampler masks them.
    min_tokens: int = 0
    ignore_eos: bool = False
    # Ends the request with finish_reason "stop" (LowConfidence) when a sampled token's probability
    # under the model is below this: the model is guessing, and the client asked not to be shown more.
    stop_below_prob: float | None = None
    # Ends the request with finish_reason "tool_calls" once the output text contains this marker (the
    # model's end-of-tool-call text, set by the API layer when the request offers tools).
    tool_call_end: str | None = None
    # Constrains the output to a grammar at sampling time (engine/response_format.py: json_object, json_schema,
    # regex, grammar); None or {"type": "text"}: free text.
    response_format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Lists are accepted and frozen, so params can be shared between threads safely.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._check()

    @property
    def resolved_max_tokens(self) -> int:
        """`max_tokens` once the engine has resolved None (in add_request), as schedulers and the
        device loop read it."""
        if self.max_tokens is None:
            raise ValueError("max_tokens is still None: the engine resolves it when the request is added")
        return self.max_tokens

    def _check(self) -> None:
        def refuse(name: str, message: str) -> None:
            raise InvalidSamplingParams(name, f"{message}, got {getattr(self, name)!r}")

        if self.max_tokens is not None and (not is_integer(self.max_tokens) or self.max_tokens < 1):
            refuse("max_tokens", "must be null or an integer >= 1")
        if not _is_number(self.temperature) or not 0 <= self.temperature <= 100:
            refuse("temperature", "must be a number in [0, 100]")
        if not is_integer(self.top_k) or self.top_k < 0:
            refuse("top_k", "must be an integer >= 0 (0 turns it off)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            refuse("top_p", "must be a number in (0, 1]")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            refuse("min_p", "must be a number in [0, 1]")
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty <= 10:
            refuse("repetition_penalty", "must be a number in (0, 10]")
        for name in ("frequency_penalty", "presence_penalty"):
            if not _is_number(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                refuse(name, "must be a number in [-2, 2]")
        # torch.Generator takes seeds in [-2**63, 2**64 - 1]; outside it would fail later, unexplained.
        if self.seed is not None and (not is_integer(self.seed) or not -2**63 <= self.seed < 2**64):
            refuse("seed", "must be null or an integer in [-2**63, 2**64 - 1]")
        if self.logprobs is not None and (not is_integer(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            refuse("logprobs", f"must be null or an integer in [0, {MAX_TOP_LOGPROBS}]")
        if self.prompt_logprobs is not None and (not is_integer(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            refuse("prompt_logprobs", f"must be null or an integer in [0, {MAX_TOP_LOGPROBS}]")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            refuse("stop", "must be a string or a list of non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidSamplingParams("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise InvalidSamplingParams("stop", f"each stop string must be at most {MAX_STOP_STRING_CHARS} characters")
        if not isinstance(self.stop_token_ids, tuple) or not all(is_integer(t) and t >= 0 for t in self.stop_token_ids):
            refuse("stop_token_ids", "must be a list of non-negative integers")
        if not is_integer(self.min_tokens) or self.min_tokens < 0:
            refuse("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            refuse("min_tokens", f"must be at most max_tokens ({self.max_tokens})")
        if not isinstance(self.ignore_eos, bool):
            refuse("ignore_eos", "must be true or false")
        if self.stop_below_prob is not None and (not _is_number(self.stop_below_prob)
                                                 or not 0 < self.stop_below_prob < 1):
            refuse("stop_below_prob", "must be null or a number in (0, 1)")
        if self.tool_call_end is not None and (not isinstance(self.tool_call_end, str) or not self.tool_call_end):
            refuse("tool_call_end", "must be null or a non-empty string")
        try:
            grammar_of(self.response_format)
        except ResponseFormatError as exc:
            raise InvalidSamplingParams("response_format", str(exc)) from None

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuses (InvalidSamplingParams) token ids the model has no logit for. The sampler writes at
        these ids (the min_tokens mask), so one past the vocabulary would fail a forward, or on CUDA
        trip a device-side assert that poisons the process; it is refused while only this request
        knows it."""
        for at, token in enumerate(self.stop_token_ids):
            if not 0 <= token < vocab_size:
                raise InvalidSamplingParams("stop_token_ids", f"{token} (item {at}) is not a token id of this "
                                                              f"model (0 to {vocab_size - 1})")

    @classmethod
    def from_dict(cls, values: object) -> "SamplingParams":
        """From a client's JSON object; an unknown key is an error naming it."""
        if not isinstance(values, dict):
            raise InvalidSamplingParams("params", "must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                raise InvalidSamplingParams(str(key), "unknown parameter")
        return cls(**values)

    @property
    def greedy(self) -> bool:
        # Below this, dividing logits by the temperature overflows to inf; the draw is the argmax anyway.
        return self.temperature < 1e-5

    @property
    def constrained(self) -> bool:
        """Whether the output follows a grammar (cheap: read on the hot path)."""
        return self.response_format is not None and self.response_format.get("type") != "text"

    @property
    def grammar(self) -> str | None:
        """The llguidance grammar the output must follow, or None (checked on construction: never raises)."""
        return grammar_of(self.response_format)

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
