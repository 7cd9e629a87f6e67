"""The door of one websocket: the refusals a frame can be given from its byte size and its socket's own
counts alone, decided when the first header of its message arrives, before the server has validated its
UTF-8, decoded it, parsed it or asked the database about it.

Daphne reads whatever a client sends as fast as it arrives, while the consumer handles one frame at a
time. Checked only in the consumer, a flood of 100 KB frames piled up unread behind it (10,000 in ten
seconds from four sockets, bench/noisy_neighbour.py), each one validated and decoded on the event loop
on its way in: every other user of the process waited for it. So the protocol that workbench/serve.py
gives Daphne (workbench/protocol/door_protocol.py) asks this door at each message's first frame and,
when it refuses, drops the message's bytes as they come (no validation, no copy) and hands the consumer
only the refusal (FRAME_REFUSED_EVENT), which answers it with the socket's usual `error` frame.

In order, a message is refused:
- `too_many_frames`: over its socket's WORKBENCH_SOCKET_FRAMES_PER_S (socket_limits.FrameBudget);
- `frame_too_large`: over WORKBENCH_MAX_FRAME_BYTES, counted over all of its fragments;
- `rate_limited`: a large message (input_work.LARGE_BYTES and up) on a socket whose large requests use
  the input thread (the API's: its consumer names the user, `share_user`), while that user's share of
  the thread is spent or their queue for it is full (workbench/serving/input_share.py). The consumer's
  own turn-taking stays the rule; this only refuses before reading what it would refuse after.
The refusals carry no request_id: nothing of the frame was read.

A consumer served without this protocol (Channels' test communicator, plain `python -m daphne`) finds
no door in its scope and applies the first two refusals itself (workbench/protocol/json_socket.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from workbench.protocol import socket_limits
from workbench.serving import input_share, input_work

SCOPE_KEY = "workbench.frame_door"  # in the scope's "extensions", as ASGI places what a server adds
FRAME_REFUSED_EVENT = "frame.refused"  # handled by JsonSocketConsumer.frame_refused


@dataclass(frozen=True)
class DoorRefusal:
    code: str
    message: str
    retry_after: int | None = None

    def event(self) -> dict[str, object]:
        """The ASGI event that hands this refusal to the socket's consumer."""
        return {"type": FRAME_REFUSED_EVENT, "code": self.code, "message": self.message, "retry_after": self.retry_after}


def too_many_frames() -> DoorRefusal:
    return DoorRefusal("too_many_frames", f"at most {settings.WORKBENCH_SOCKET_FRAMES_PER_S} frames a second on "
                                          "one socket; this one was dropped", 1)


def too_large(size: int) -> DoorRefusal | None:
    """The refusal of a message of `size` bytes (so far) by the size limit, or None."""
    if size <= settings.WORKBENCH_MAX_FRAME_BYTES:
        return None
    return DoorRefusal("frame_too_large", f"frames are limited to {settings.WORKBENCH_MAX_FRAME_BYTES} bytes")


class FrameDoor:
    """One socket's door: its frame budget, and whose input share its large frames draw on."""

    def __init__(self) -> None:
        self.budget = socket_limits.FrameBudget()
        self.share_user: str | None = None

    def admit(self, size: int) -> DoorRefusal | None:
        """Asked once per message, at its first frame's header: `size` is that frame's length. The
        budget counts every message, refused or not, as the consumer's own check did."""
        if not self.budget.take():
            return too_many_frames()
        refusal = too_large(size)
        if refusal is None and self.share_user is not None and size >= input_work.LARGE_BYTES:
            refused = input_share.SHARES.refusal(self.share_user)
            if refused is not None:
                refusal = DoorRefusal(refused.code, refused.message, refused.retry_after)
        return refusal

    def admit_more(self, size: int) -> DoorRefusal | None:
        """Asked at each later fragment of an admitted message: `size` is the message's length so far."""
        return too_large(size)
