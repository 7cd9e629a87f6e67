"""The websocket API's frames (/ws/v1/generate, docs/PROTOCOL.md) checked, as plain functions that need
no socket: each returns what the frame asks for or raises FrameError with the code the client gets.
The prompt and the parameters are checked by the rules every API shares (workbench/protocol/request_input.py)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from engine import SamplingParams
from engine.loading.tokenizer import Tokenizer
from workbench.api import choice_streams
from workbench.protocol import request_input
from workbench.protocol.json_input import LONE_SURROGATE
from workbench.protocol.json_socket import FrameError

MAX_REQUEST_ID_CHARS = 128
MAX_ACTIVE_REQUESTS = 64
Kind = Literal["generate", "cancel"]
KINDS: tuple[Kind, ...] = ("generate", "cancel")


def request_id_of(frame: object) -> str | None:
    """The frame's request_id where an error may echo it: a string UTF-8 can carry; else None."""
    request_id = frame.get("request_id") if isinstance(frame, dict) else None
    return request_id if isinstance(request_id, str) and not LONE_SURROGATE.search(request_id) else None


def kind(frame: dict[str, object]) -> Kind:
    name = frame.get("type")
    for known in KINDS:
        if name == known:
            return known
    raise FrameError("unknown_type", f"unknown frame type {name!r}; expected generate or cancel", request_id_of(frame))


def new_request_id(frame: dict[str, object], running: Collection[str]) -> str:
    """The request_id of a generate frame, free on a socket already running the requests `running`."""
    request_id = frame.get("request_id")
    # Printable only: the id travels into the engine's request id, which the workers log, and a newline
    # or a terminal's control character there would let a client write log lines of its own.
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS \
            or not request_id.isprintable():
        raise FrameError("invalid_request", f"request_id must be a string of 1-{MAX_REQUEST_ID_CHARS} printable "
                                            "characters (no control characters, line breaks or format characters)",
                         request_id_of(frame))
    if request_id in running:
        raise FrameError("duplicate_request_id", f"request {request_id!r} is still running on this socket", request_id)
    if len(running) >= MAX_ACTIVE_REQUESTS:
        raise FrameError("too_many_requests", f"at most {MAX_ACTIVE_REQUESTS} requests per socket", request_id)
    return request_id


def cancelled_request_id(frame: dict[str, object], running: Collection[str]) -> str:
    """The request a cancel frame names, one of `running`. Request ids are per socket: another user's
    (or another socket's) request is unknown here."""
    request_id = frame.get("request_id")
    if not isinstance(request_id, str) or request_id not in running:
        raise FrameError("unknown_request_id", f"no running request {request_id!r} on this socket",
                         request_id_of(frame))
    return request_id


def generation(frame: dict[str, object], tokenizer: Tokenizer, request_id: str,
               vocabulary: int | None = None) -> tuple[str | list[int], SamplingParams, int | None]:
    """The prompt (text or token ids; messages rendered by `tokenizer`), the params and the number of
    choices (`params.n`; None when not sent, a request of one choice whose frames carry no `choice`) of
    a generate frame. `vocabulary`: the model's (workbench/serving/model_facts.py), which every token id
    the frame names must fit; None checks no range (the engine still does)."""
    if ("prompt" in frame) == ("messages" in frame):
        raise FrameError("invalid_request", "send exactly one of prompt or messages", request_id)
    try:
        prompt = (request_input.prompt(frame["prompt"]) if "prompt" in frame
                  else request_input.chat_prompt(tokenizer, frame["messages"]))
        values, n = frame.get("params", {}), None
        if isinstance(values, dict) and "n" in values:  # the choices are the request's, not a sequence's params
            n = choice_streams.choice_count(values["n"])
            values = {key: value for key, value in values.items() if key != "n"}
        params = request_input.sampling_params(values, logprobs_allowed=True)
        if vocabulary is not None:
            request_input.fit_vocabulary(prompt, params, vocabulary)
        return prompt, params, n
    except request_input.InvalidInput as exc:
        raise FrameError(exc.code, exc.message, request_id) from None

