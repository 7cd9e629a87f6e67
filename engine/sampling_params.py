"""SamplingParams: what a request asks of generation, checked on construction.

Each invalid value raises `InvalidSamplingParams` naming the parameter, so the API layers can
return it to the client as is.
"""

from __future__ import annotations

from dataclasses import dataclass


class InvalidSamplingParams(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidSamplingParams("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or not 0 <= self.temperature <= 100:
            raise InvalidSamplingParams("temperature", f"must be a number in [0, 100], got {self.temperature!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidSamplingParams("seed", f"must be an integer or null, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
