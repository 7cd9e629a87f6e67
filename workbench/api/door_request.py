"""Daphne's HTTP request with a door (workbench/api/http_door.py): a body the door refuses is answered
at once and never read into memory, a file or the application. workbench/serve.py has Daphne build its
HTTP requests with it.

Twisted calls gotLength once the headers are in (the length None for a chunked body), then
handleContentChunk as the body arrives, and process once it is whole. Twisted writes `100 Continue`
after gotLength to a client that asked for it: where the door still has to ask the database, the header
is taken away first and the 100 is sent only once the body is let in, so that such a client (curl, for
a large body) sends none of a refused one.

While the door asks (a large body on an input-thread route: the token's user and their share), the
socket is not read: the client's sends wait in TCP's buffers. What one read brought in with the headers
is kept meanwhile; the request reaches the application once the body is let in and whole.

Twisted's HTTPChannel pauses the same socket for its own backpressure, and a transport's pause and
resume are not counted: one resume undoes every pause. With a pipelining client that reads none of its
answers, the door's resume on letting a body in undid twisted's pause (the transport, its send buffer
full, asks for one at the `100 Continue`), and the client catching up made twisted resume the socket
while the door still asked. So both go through a ReadSwitch, which reads the socket only while neither
holds it. (Twisted's other pause, for a pipelined request buffered past 16 KB while one is served, takes
a read to happen, which the door's hold rules out.)

A refused request's answer is written straight away with `Connection: close`. What the client still
sends is dropped as it comes, not stored or parsed, for at most LINGER_S, so that a client that writes
its whole body before it reads (Python's http.client, httpx) finds the answer; then the connection
closes. So also for a client that waits for `100 Continue` (which curl stops waiting for after a second).
"""

from __future__ import annotations

import asyncio
import io
import logging
from typing import Any
from urllib.parse import unquote

from daphne.http_protocol import WebRequest
from twisted.internet.defer import Deferred

from workbench.api import http_door, input_routes
from workbench.api.http_api import ApiError
from workbench.serving import input_work

logger = logging.getLogger(__name__)

LINGER_S = 5.0  # as nginx's lingering_timeout: long enough for a client to finish writing a refused body


class DoorRequest(WebRequest):
    refused = False
    pending = False  # the door is asking the database; the socket is not read meanwhile
    arrived = False  # the body is whole while the door was asking: process() runs once it lets it in
    asked = False  # the door asked (or is asking) about this body's user
    expects_continue = False  # the client waits for `100 Continue`, which the door holds back
    heading = False  # in gotLength: twisted has not answered `Expect: 100-continue` yet
    received = 0  # bytes of the body so far
    # The request line's method and target, kept from gotLength: the channel lets them go once the body is
    # whole, and a refusal may come after that (the door still asking when the last byte arrived).
    raw_method = b""
    raw_path = b""
    clock: Any = None  # what schedules the close (IReactorTime): the running reactor unless a test gives its own

    def gotLength(self, length: int | None) -> None:
        self.heading = True
        try:
            self._got_length(length)
        finally:
            self.heading = False

    def _got_length(self, length: int | None) -> None:
        # The request line is the channel's until the body is whole (an HTTP/2 stream has none: its
        # refusals take the pages' shape, and its large bodies go to the view's own checks).
        method, raw = getattr(self.channel, "_command", None), getattr(self.channel, "_path", None)
        self.raw_method = method if isinstance(method, bytes) else b""
        self.raw_path = raw if isinstance(raw, bytes) else b""
        refusal = None if length is None else http_door.too_large(length)
        if refusal is not None:
            self.content = io.BytesIO()
            self._refuse(refusal)
            return
        super().gotLength(length)
        if length is not None and length >= input_work.LARGE_BYTES:
            self._ask()

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.received += len(data)
        refusal = http_door.too_large(self.received)  # a chunked body, counted as it streams in
        if refusal is not None:
            self._refuse(refusal)
            return
        super().handleContentChunk(data)
        if self.received >= input_work.LARGE_BYTES:
            self._ask()

    def process(self) -> Any:
        if self.refused:
            return None
        if self.pending:
            self.arrived = True
            return None
        return super().process()

    @property
    def body_path(self) -> str:
        """The path without its query, as Daphne and Django route it: only a refusal or a large body
        needs it, so a small request never decodes it."""
        return unquote(self.raw_path.split(b"?", 1)[0].decode("latin-1"))

    def _ask(self) -> None:
        """Asks the door whether the large body of an input-thread route may be read, once."""
        if self.asked:
            return
        self.asked = True
        route = input_routes.route_of(self.body_path)
        if route is None:
            return
        self.pending = True
        self._hold_continue()
        self._reading().hold()
        headers = {name.decode("latin-1").lower(): values[0].decode("latin-1")
                   for name, values in self.requestHeaders.getAllRawHeaders()}
        # The lookup is the database's (an asyncio future, on the loop Daphne's reactor runs on).
        asking = asyncio.ensure_future(http_door.refusal_of_large(route, headers))
        Deferred.fromFuture(asking).addCallbacks(self._answered, self._failed)

    def _hold_continue(self) -> None:
        """While the headers are being taken in: takes `Expect: 100-continue` from twisted, which would
        answer it (an HTTP/1.1 request's) as soon as gotLength returns, before the door has decided."""
        expect = self.requestHeaders.getRawHeaders(b"expect") if self.heading else None
        if expect:
            self.expects_continue = expect[0].lower() == b"100-continue" and \
                getattr(self.channel, "_version", None) == b"HTTP/1.1"
            self.requestHeaders.removeHeader(b"expect")

    def _answered(self, refusal: ApiError | None) -> None:
        self.pending = False
        if self.channel is None or self.refused:  # the client left, or the body grew too large meanwhile
            return
        if refusal is not None:
            self._refuse(refusal)
            return
        if self.expects_continue:
            self.channel.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._reading().release()
        if self.arrived:
            super().process()

    def _failed(self, failure: Any) -> None:
        # The token's lookup failed (the database is down): letting the body in unchecked would read any
        # stranger's large body for a view that cannot check it either; the client is told to come back.
        logger.error("the HTTP door could not check a request's token: %s", failure.getTraceback())
        self._answered(http_door.unavailable())

    def _refuse(self, refusal: ApiError) -> None:
        self.refused = True
        self._hold_continue()
        channel, transport = self.channel, self.channel.transport
        content, self.content = self.content, io.BytesIO()
        content.close()  # what was kept of the body
        # Everything the client sends from now on is dropped; twisted's own parser sees none of it.
        channel.dataReceived = channel.lineReceived = channel.rawDataReceived = _drop
        # A chunked body is refused from inside its decoder, which would go on parsing the rest of the
        # same read (and answer bytes that are no chunk with a 400 of its own): it is left nothing.
        decoder = getattr(channel, "_transferDecoder", None)
        if decoder is not None and isinstance(getattr(decoder, "_buffer", None), bytearray):
            decoder.dataCallback = decoder.finishCallback = _drop
            del decoder._buffer[:]
        response = http_door.through_middleware(self._scope(), http_door.answer(self.body_path, refusal))
        response["Content-Length"] = str(len(response.content))
        response["Connection"] = "close"
        transport.write(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n".encode("latin-1")
                        + response.serialize_headers() + b"\r\n\r\n" + response.content)
        self._log(response.status_code, len(response.content))
        # Also where the client waits for `100 Continue`: curl sends its body anyway after a second without
        # one, and a close with its bytes unread would reset the connection before it reads the answer.
        # Whatever twisted held it for is over: nothing more is parsed or kept.
        self._reading().open()
        if self.clock is None:
            from twisted.internet import reactor  # the one Daphne installed, running by now

            self.clock = reactor
        self.clock.callLater(LINGER_S, transport.loseConnection)

    def _reading(self) -> ReadSwitch:
        """The switch of the connection's reading; a bare one over the transport where the channel has
        none (an HTTP/2 stream)."""
        switch = getattr(self.channel, "_networkProducer", None)
        return switch if isinstance(switch, ReadSwitch) else ReadSwitch(self.channel.transport)

    def _scope(self) -> dict[str, Any]:
        """The request as an ASGI scope, as Daphne would give it to the application (without the body)."""
        peer, host = self.channel.transport.getPeer(), self.channel.transport.getHost()
        raw_path, _, query = self.raw_path.partition(b"?")
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "scheme": "https" if self.isSecure() else "http", "method": self.raw_method.decode("ascii", "replace"),
                "path": self.body_path, "raw_path": raw_path, "query_string": query,
                "root_path": getattr(self.server, "root_path", ""),
                "headers": [(name.lower(), value) for name, values in self.requestHeaders.getAllRawHeaders()
                            for value in values],
                "client": (peer.host, peer.port) if hasattr(peer, "host") else None,
                "server": (host.host, host.port) if hasattr(host, "host") else None}

    def _log(self, status: int, size: int) -> None:
        """Daphne's access log line, as for a request that reached the application."""
        client = self.channel.transport.getPeer()
        self.server.log_action("http", "complete", {
            "path": self.body_path, "status": status, "method": self.raw_method.decode("ascii", "replace"),
            "time_taken": 0, "size": size,
            "client": f"{client.host}:{client.port}" if hasattr(client, "host") else None})


class ReadSwitch:
    """Whether a connection's socket is read, in front of its transport as the HTTPChannel's network
    producer: the channel pauses and resumes it (its backpressure), the door holds and releases it, and
    the socket is read only while neither does."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.paused = False  # by the channel
        self.held = False  # by the door

    def pauseProducing(self) -> None:
        self.paused = True
        self._apply()

    def resumeProducing(self) -> None:
        self.paused = False
        self._apply()

    def hold(self) -> None:
        self.held = True
        self._apply()

    def release(self) -> None:
        self.held = False
        self._apply()

    def open(self) -> None:
        """Read on, whatever either wanted: a refused request's connection drops all it reads."""
        self.paused = self.held = False
        self._apply()

    def _apply(self) -> None:
        """The transport reads while neither side stops it (pausing twice, or resuming twice, is harmless)."""
        if self.paused or self.held:
            self.transport.pauseProducing()
        else:
            self.transport.resumeProducing()

    # What else the channel (and twisted's HTTP/2 upgrade) asks of its network producer.
    def stopProducing(self) -> None:
        self.transport.stopProducing()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self.transport.unregisterProducer()


def _drop(data: bytes) -> None:
    """What a refused request's connection does with what it still receives."""


def install(http_factory: Any) -> None:
    """Has Daphne's HTTP factory (built inside Server.run) give every connection this request class:
    its buildProtocol sets Daphne's own class on each protocol it builds."""
    input_routes.routes()  # read from the URLconf now: a marked view it cannot guard stops the start
    build = http_factory.buildProtocol

    def build_with_door(addr: object) -> Any:
        protocol = build(addr)
        protocol.requestFactory = DoorRequest
        channel = getattr(protocol, "_channel", protocol)  # twisted's HTTP/1.1 channel, behind its negotiator
        made = channel.connectionMade

        def connection_made() -> None:
            made()  # sets the channel's network producer: the transport
            channel._networkProducer = ReadSwitch(channel._networkProducer)

        channel.connectionMade = connection_made
        return protocol

    http_factory.buildProtocol = build_with_door
