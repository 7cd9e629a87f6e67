"""Daphne's websocket protocol with a door (workbench/protocol/frame_door.py): a message the door refuses
is dropped as its bytes arrive, never validated as UTF-8, joined, decoded or queued for the consumer,
which is handed the refusal instead. workbench/serve.py has Daphne build its sockets with it.

Autobahn calls onMessageBegin, then for each fragment onMessageFrameBegin (its length known from the
header), onMessageFrameData (as the payload arrives, after autobahn's incremental UTF-8 validation of
that piece) and onMessageFrameEnd, then onMessageEnd; the validation of a message's later pieces is
switched off by utf8validateIncomingCurrentMessage, which autobahn reads before each piece.

A socket whose frame is refused for its rate (too_many_frames) is also not read again until its budget
holds a frame: what the client sends meanwhile waits in TCP's buffers and its sends block, instead of
the server reading, unmasking and answering a frame it would only drop. What was read already is still
answered frame by frame, and so is every frame read later beyond the budget; nothing is lost. Twisted
reads a socket 64 KiB at a time, so a flooding socket costs at most that much reading per pause.
"""

from __future__ import annotations

from typing import Any

from daphne.ws_protocol import WebSocketProtocol

from workbench.protocol.frame_door import DoorRefusal, FrameDoor


class DoorWebSocketProtocol(WebSocketProtocol):
    door: FrameDoor
    refused: DoorRefusal | None = None  # the refusal of the message being received
    fragments = 0  # of the message being received, begun so far

    resume: Any = None  # the call that reads the socket again, while it is held back
    clock: Any = None  # what schedules it (IReactorTime): Daphne's reactor unless a test gives its own

    def onConnect(self, request):
        self.door = FrameDoor()
        return super().onConnect(request)

    def connectionLost(self, reason: object) -> None:
        if self.resume is not None and self.resume.active():
            self.resume.cancel()
        super().connectionLost(reason)

    def onMessageBegin(self, isBinary: bool) -> None:
        super().onMessageBegin(isBinary)
        self.refused, self.fragments = None, 0

    def onMessageFrameBegin(self, length: int) -> None:
        super().onMessageFrameBegin(length)  # autobahn's own limit first: over it the socket closes (1009)
        self.fragments += 1
        if self.failedByMe or self.refused is not None:
            return
        size = self.message_data_total_length
        self.refused = self.door.admit(size) if self.fragments == 1 else self.door.admit_more(size)
        if self.refused is not None:
            self.utf8validateIncomingCurrentMessage = False
            self.message_data = list[bytes]()  # earlier fragments of a message refused by its size are dropped too
            if self.refused.code == "too_many_frames":
                self._hold_back()

    def _hold_back(self) -> None:
        if self.resume is not None and self.resume.active():
            return
        if self.clock is None:
            from twisted.internet import reactor  # the one Daphne installed, running by now

            self.clock = reactor
        self.transport.pauseProducing()
        self.resume = self.clock.callLater(self.door.budget.wait_s(), self._read_again)

    def _read_again(self) -> None:
        self.resume = None
        if self.transport is not None and self.transport.connected:
            self.transport.resumeProducing()

    def onMessageFrameData(self, payload: bytes) -> None:
        if self.refused is None:
            super().onMessageFrameData(payload)

    def onMessageFrameEnd(self) -> None:
        if self.refused is None:
            super().onMessageFrameEnd()
        else:
            self.frame_data = None

    def onMessageEnd(self) -> None:
        if self.refused is None:
            super().onMessageEnd()
            return
        refused, self.refused, self.message_data = self.refused, None, list[bytes]()
        # As Daphne's onMessage does for a message it delivers: a muted socket (closing) hears nothing.
        if not self.muted and not self.failedByMe and hasattr(self, "application_queue"):
            self.application_queue.put_nowait(refused.event())
