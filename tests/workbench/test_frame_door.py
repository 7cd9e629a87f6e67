"""The websocket door (workbench/protocol/frame_door.py, door_protocol.py): a frame over its socket's rate,
over the size limit, or large while its user's share of the input thread is spent is refused as it
arrives, before it is read: never validated as UTF-8, decoded, parsed or looked up.

What shows "never read" here: each refused frame holds bytes that are not UTF-8. A frame the server
reads, validates them and closes the socket with 1007 (invalid payload), so every refusal below is
answered with the refusal and the socket goes on only because the frame was not read. Each case has its
control: the same frame within the limit closes the socket, or a valid one is answered.

Three layers: the door's rules alone; Daphne's protocol with the door, driven byte by byte over a fake
transport (the socket held back while over its rate, and read again when it may send); and a real
Daphne started as deployments start it (workbench/serve.py).
"""

from __future__ import annotations

import asyncio
import json
import struct
from types import SimpleNamespace

import pytest
import websockets
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from tests.workbench.test_hostile_input import next_frame, until_done
from workbench.protocol import frame_door, socket_limits
from workbench.serving import input_share, input_work

NOT_UTF8 = b"\xff\xfe"
FRAME_LIMIT = 256 * 1024  # the default WORKBENCH_MAX_FRAME_BYTES


@pytest.fixture
def shares(monkeypatch, settings):
    settings.WORKBENCH_USER_INPUT_SHARE = 0.25
    settings.WORKBENCH_USER_INPUT_QUEUE = 2
    fresh = input_share.InputShares()
    monkeypatch.setattr(input_share, "SHARES", fresh)
    return fresh


def test_the_door_counts_every_frame_against_the_rate_then_refuses_by_size(settings, shares):
    settings.WORKBENCH_SOCKET_FRAMES_PER_S = 3  # bursts of 6
    settings.WORKBENCH_MAX_FRAME_BYTES = 1000
    door = frame_door.FrameDoor()
    verdicts = [door.admit(size) for size in (10, 1000, 1001, 10, 10, 10)]
    assert verdicts[:2] == [None, None] and verdicts[3:] == [None, None, None], verdicts
    assert verdicts[2] is not None and verdicts[2].code == "frame_too_large" and "1000 bytes" in verdicts[2].message
    refused = door.admit(10)  # the seventh: the refused one counted too
    assert refused is not None and (refused.code, refused.retry_after) == ("too_many_frames", 1), refused
    assert door.admit_more(1000) is None and door.admit_more(1001).code == "frame_too_large", \
        "a message's later fragments count towards its size"


def test_a_large_frame_is_refused_at_the_door_while_its_users_share_is_spent(settings, shares):
    settings.WORKBENCH_SOCKET_FRAMES_PER_S = 0
    door, bystander = frame_door.FrameDoor(), frame_door.FrameDoor()
    door.share_user = bystander.share_user = "flood"
    large = input_work.LARGE_BYTES
    assert door.admit(large) is None, "liveness: within the share a large frame passes"
    shares.take_turn("flood")
    shares.spent("flood", 3.0)  # over 0.25 of 10 s
    shares.leave("flood")
    refused = door.admit(large)
    assert refused is not None and refused.code == "rate_limited" and refused.retry_after >= 1, refused
    assert "WORKBENCH_USER_INPUT_SHARE" in refused.message
    assert door.admit(large - 1) is None, "a small frame is read where it arrives, outside the share"
    unshared = frame_door.FrameDoor()  # a socket whose frames never reach the input thread (chat, dashboard)
    assert unshared.admit(large) is None
    other = frame_door.FrameDoor()
    other.share_user = "quiet"
    assert other.admit(large) is None, "another user's share is their own"


class FakeServer:
    """What Daphne's protocol asks of its server, with the application's queue kept for the test."""

    root_path = ""
    proxy_forwarded_address_header = None

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def protocol_connected(self, protocol: object) -> None:
        pass

    def protocol_disconnected(self, protocol: object) -> None:
        pass

    def create_application(self, protocol: object, scope: dict) -> asyncio.Queue:
        return self.queue

    def log_action(self, *args: object) -> None:
        pass

    def events(self) -> list[dict]:
        taken = []
        while not self.queue.empty():
            taken.append(self.queue.get_nowait())
        return [e for e in taken if e["type"] != "websocket.connect"]


class Transport(StringTransport):
    """A fake TCP transport that, like Twisted's, lets a protocol that fails its connection unregister a
    producer it never registered."""

    def unregisterProducer(self) -> None:
        self.producer = None


def client_frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it."""
    mask, n = b"\x11\x22\x33\x44", len(payload)
    length = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n) if n < 65536 \
        else bytes([0x80 | 127]) + struct.pack("!Q", n)
    return b"\x81" + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@pytest.fixture
def door_socket(settings, monkeypatch):
    """Daphne's protocol with the door, its handshake done over a fake transport, on a clock of the
    test's own (the frame budget's and the held-back socket's): (protocol, transport, server, clock)."""
    from daphne.ws_protocol import WebSocketFactory

    from workbench.protocol.door_protocol import DoorWebSocketProtocol

    settings.WORKBENCH_SOCKET_FRAMES_PER_S = 2  # bursts of 4
    clock = Clock()
    monkeypatch.setattr(socket_limits, "time", SimpleNamespace(monotonic=clock.seconds))
    asyncio.set_event_loop(loop := asyncio.new_event_loop())
    server = FakeServer()
    factory = WebSocketFactory(server, server="test")
    factory.protocol = DoorWebSocketProtocol
    protocol = factory.buildProtocol(("127.0.0.1", 1))
    protocol.clock = clock
    transport = Transport()
    protocol._raw_query_string = b""  # what Daphne's HTTP side hands over with the upgrade
    protocol.makeConnection(transport)
    protocol.dataReceived(b"GET /ws/v1/generate HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    protocol.serverAccept()
    assert transport.value().startswith(b"HTTP/1.1 101"), transport.value()
    yield protocol, transport, server, clock
    asyncio.set_event_loop(None)
    loop.close()


def test_frames_over_the_rate_are_dropped_unread_and_the_socket_is_not_read_until_it_may_send(door_socket):
    protocol, transport, server, clock = door_socket
    ok = b'{"type": "cancel", "request_id": "x"}'
    protocol.dataReceived(b"".join(client_frame(ok) for _ in range(4)))  # the burst: read
    assert [e["type"] for e in server.events()] == ["websocket.receive"] * 4
    assert transport.producerState == "producing"
    protocol.dataReceived(client_frame(NOT_UTF8) + client_frame(NOT_UTF8))
    assert protocol.state == protocol.STATE_OPEN and not protocol.failedByMe, "a dropped frame is not validated"
    refused = server.events()
    assert [(e["type"], e["code"]) for e in refused] == [("frame.refused", "too_many_frames")] * 2, refused
    assert transport.producerState == "paused", "over its rate the socket is not read"
    clock.advance(0.4)
    assert transport.producerState == "paused", "not before its budget holds a frame (2 a second)"
    clock.advance(0.2)
    assert transport.producerState == "producing", "read again once it may send"
    protocol.dataReceived(client_frame(ok))
    assert [e["type"] for e in server.events()] == ["websocket.receive"]
    clock.advance(1.0)
    protocol.dataReceived(client_frame(NOT_UTF8))  # within the rate, read: the control of "unread" above
    assert protocol.failedByMe and protocol.state != protocol.STATE_OPEN, "a frame that is read is validated"


def test_a_frame_over_the_size_limit_is_dropped_unread_in_all_its_fragments(door_socket, settings):
    protocol, _, server, _ = door_socket
    settings.WORKBENCH_MAX_FRAME_BYTES = 100
    first, second = b'{"pad": "' + b"x" * 80, NOT_UTF8 * 20 + b'"}'
    mask = b"\x01\x02\x03\x04"

    def fragment(payload: bytes, opcode: int, fin: bool) -> bytes:
        return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + mask + \
            bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    # Under the limit after its first fragment, over it with the second, which is not UTF-8.
    protocol.dataReceived(fragment(first, 1, False) + fragment(second, 0, True))
    assert protocol.state == protocol.STATE_OPEN and not protocol.failedByMe
    assert [(e["type"], e["code"]) for e in server.events()] == [("frame.refused", "frame_too_large")]
    protocol.dataReceived(client_frame(b'{"fits": 1}'))
    assert server.events() == [{"type": "websocket.receive", "text": '{"fits": 1}'}], "the next message is whole"


def connect(address: str, token: str):
    return websockets.connect(f"ws://{address}/ws/v1/generate", max_size=None,
                              additional_headers={"Authorization": f"Bearer {token}"})


@pytest.mark.slow  # the session's limited Daphne (tests/workbench/conftest.py): a share one large request spends
def test_through_daphne_refused_frames_are_answered_unread_and_the_socket_goes_on(limited_daphne):
    """An oversized frame, and a large one after the user's one large request spent their share, each
    hold bytes that are not UTF-8: each is answered with its refusal (no request_id: nothing of it was
    read) and the socket answers its next frame. The control: the same bytes in a frame the door lets
    through close the socket with 1007."""
    address, tokens = limited_daphne
    # About 190 KB of messages: templated and tokenized on the input thread, which spends the share.
    big_messages = [{"role": "user", "content": "The list type is a mutable sequence of items. " * 4000}]
    oversized = b'{"type": "cancel", "pad": "' + NOT_UTF8 * (FRAME_LIMIT // 2) + b'"}'
    large = b'{"type": "cancel", "pad": "' + NOT_UTF8 * input_work.LARGE_BYTES + b'"}'

    async def run() -> tuple[list[dict], dict, int | None]:
        async with connect(address, tokens["door"]) as ws:
            seen: list[dict] = []
            await ws.send(oversized, text=True)
            seen.append(await next_frame(ws, "frame_too_large", seen))
            await ws.send(json.dumps({"type": "generate", "request_id": "spends", "messages": big_messages,
                                      "params": {"max_tokens": 1}}))
            spends = await until_done(ws, "spends", seen)
            seen += spends
            await ws.send(large, text=True)
            seen.append(await next_frame(ws, "rate_limited", seen))
            await ws.send(json.dumps({"type": "cancel", "request_id": "nope"}))
            seen.append(await next_frame(ws, "unknown_request_id", seen))
        async with connect(address, tokens["door-control"]) as control:
            await control.send(NOT_UTF8 * 8, text=True)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(control.recv(), 30)
        return seen, spends[-1], closed.value.rcvd.code if closed.value.rcvd else None

    seen, spent, control_code = asyncio.run(run())
    errors = [f for f in seen if f["type"] == "error" and f is not spent]
    assert [e["code"] for e in errors] == ["frame_too_large", "rate_limited", "unknown_request_id"], seen
    assert errors[0]["request_id"] is None and str(FRAME_LIMIT) in errors[0]["message"], errors[0]
    assert errors[1]["request_id"] is None and "WORKBENCH_USER_INPUT_SHARE" in errors[1]["message"], errors[1]
    assert errors[1]["retry_after"] >= 1, errors[1]
    assert spent.get("code") != "rate_limited", f"liveness: within the share the large request was read: {spent}"
    assert control_code == 1007, f"the control: a frame that is read is validated ({control_code})"
