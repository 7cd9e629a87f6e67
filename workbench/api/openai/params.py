"""The OpenAI request fields that do not map one to one onto SamplingParams: `logprobs` and
`top_logprobs` (whose meaning differs between the two endpoints) and `n` (one engine sequence per
choice, each with its own seed: workbench/api/choice_streams.py). docs/PROTOCOL.md, "OpenAI-compatible
HTTP API".
"""

from __future__ import annotations

from engine.sampling_params import MAX_TOP_LOGPROBS, is_integer
from workbench.api import choice_streams
from workbench.api.http_api import ApiError
from workbench.protocol.request_input import InvalidInput


def endpoint_fields(kind: str) -> set[str]:
    """The fields only the endpoint `kind` ("chat" or "completion") takes, and those this module and
    prompt_report.py read."""
    if kind == "chat":
        return {"messages", "logprobs", "top_logprobs", "n", "prompt_logprobs"}
    return {"prompt", "logprobs", "n", "echo", "prompt_logprobs"}


def logprob_values(kind: str, body: dict) -> dict[str, object]:
    """SamplingParams' `logprobs` (the number of top alternatives, or absent for none) from the body.
    Chat: `logprobs` is a boolean and `top_logprobs` (0-20) needs it true; completions: `logprobs` is
    the number of alternatives itself (0-20 here; OpenAI allows 5)."""
    logprobs = body.get("logprobs")
    if kind == "completion":
        return {} if logprobs is None else {"logprobs": logprobs}  # SamplingParams checks the range
    if logprobs is not None and not isinstance(logprobs, bool):
        raise ApiError(400, "logprobs must be true or false", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not is_integer(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    if top is not None and logprobs is not True:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return {"logprobs": top or 0} if logprobs else {}


def choice_count(body: dict) -> int:
    """The body's `n` (null or left out: one choice)."""
    if body.get("n") is None:
        return 1
    try:
        return choice_streams.choice_count(body["n"])
    except InvalidInput as exc:
        raise ApiError.refused(exc) from None
