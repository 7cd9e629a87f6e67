"""The chat socket's frames (/ws/chat/<id>) checked, as plain functions that need no socket: each returns
what the page asks for or raises FrameError with the code the page gets. The parameters follow the
rules every API shares (workbench/protocol/request_input.py).

    <- {"type": "send", "content": "...", "params": {...}, "model": "..."}
                                                             a new message, answered (by `model`, one of
                                                             those served; left out: the default)
    <- {"type": "regenerate", "params": {...}, "model": "..."}  the last message answered again (a new version)
    <- {"type": "edit", "message_id": N, "content": "...", "params": {...}}
                                                             a user message shown (default: the last) reworded,
                                                             a new branch from there, answered
    <- {"type": "stop"}
    <- {"type": "resume", "from_offset": N}                   follow the reply under way from token offset N
    -> started {asked: {message_id, versions}}, delta {index, text},
       done {message_id, finish_reason, error, usage, timings, title, versions, model},
       error {code, message}
"""

from __future__ import annotations

from typing import Literal

from engine import SamplingParams
from workbench.chat.models import Turn
from workbench.chat.stored_text import nul_refusal
from workbench.protocol import request_input
from workbench.protocol.json_socket import FrameError

MAX_MESSAGE_CHARS = 20_000
# No max_tokens from the page: the reply may run to the end of the model's context.
DEFAULTS = {"max_tokens": None}
KINDS: tuple[Turn | Literal["stop", "resume"], ...] = ("send", "regenerate", "edit", "stop", "resume")


def kind(frame: dict[str, object]) -> Turn | Literal["stop", "resume"]:
    name = frame.get("type")
    for known in KINDS:
        if name == known:
            return known
    raise FrameError("unknown_type", f"unknown frame type {name!r}")


def turn_request(turn: Turn, frame: dict[str, object]) -> tuple[str | None, SamplingParams]:
    """The new message's text (None for a regenerate) and the reply's parameters."""
    try:
        params = request_input.sampling_params(frame.get("params", {}), DEFAULTS)
    except request_input.InvalidInput as exc:
        raise FrameError(exc.code, exc.message) from None
    if turn == "regenerate":
        return None, params
    content = frame.get("content")
    if not isinstance(content, str) or not content.strip() or len(content) > MAX_MESSAGE_CHARS:
        raise FrameError("invalid_request", f"content must be 1-{MAX_MESSAGE_CHARS} characters of text")
    if (refusal := nul_refusal("content", content)) is not None:
        raise FrameError("invalid_request", refusal)
    return content, params


def fit_vocabulary(params: SamplingParams, vocabulary: int) -> None:
    """The reply's token ids (`stop_token_ids`) within the vocabulary of the model that answers."""
    try:
        request_input.fit_vocabulary(None, params, vocabulary)
    except request_input.InvalidInput as exc:
        raise FrameError(exc.code, exc.message) from None


def edited_message(frame: dict[str, object]) -> int | None:
    """The id of the user message an `edit` rewords; None: the last one shown."""
    message_id = frame.get("message_id")
    if message_id is None:
        return None
    if not isinstance(message_id, int) or isinstance(message_id, bool) or message_id < 1:
        raise FrameError("invalid_request", "message_id must be the id of a message of yours shown here")
    return message_id


def resume_offset(frame: dict[str, object]) -> int:
    """The token offset a `resume` asks to follow the reply from: the page has every token before it."""
    offset = frame.get("from_offset", 0)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise FrameError("invalid_request", "from_offset must be a whole number of tokens, 0 or more")
    return offset
