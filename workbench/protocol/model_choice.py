"""The served model a socket frame names: what the chat and the websocket API both read from `model`."""

from __future__ import annotations

from workbench.protocol.json_socket import FrameError
from workbench.serving import served_models


def model_of(frame: dict[str, object], served: list[str], request_id: str | None = None) -> str:
    """The served model a frame's `model` names (left out: the default one; served_models.py)."""
    try:
        return served_models.resolve(frame.get("model"), served)
    except served_models.UnknownModel as exc:
        raise FrameError("invalid_request" if exc.not_a_string else "model_not_found", exc.message,
                         request_id) from None
