"""The noisy neighbour's flood sent at the least client CPU per byte: a stand-in for a flood from
another machine, measured on one host.

bench/noisy_neighbour.py's own flood builds every request with httpx and websockets: JSON-encoding a
100 KB frame, masking it, parsing each 250 KB /tokenize answer. On a 2-core host that client takes about
a quarter of a core from the server it floods (23-26% while flooding, docs/BENCHMARKS.md), so the quiet
user's slowdown mixes the server's cost with the client's. This client sends the same bytes with as
little work as a hostile one would do (about a tenth of a core):
- /tokenize: one HTTP/1.1 request built once, written again and again on a kept-alive connection; each
  answer read to its end (Content-Length or chunked) and only its status line looked at;
- the websocket API: the handshake written by hand, then text frames whose JSON is built once with a
  placeholder for the request id and the schema's maxLength (bytes.replace per frame), masked with the
  all-zero key (RFC 6455 lets a client choose any key; XOR with zero leaves the payload as it is, so
  nothing is computed per byte); the server's frames are read and counted by their type.
The server sees what the usual flood sends it (the same JSON text per frame, a new schema each time).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from collections import Counter
from collections.abc import Callable

REQUEST_ID = "__REQUEST_ID__"
MAX_LENGTH = 987654321  # a schema's maxLength no frame uses, replaced in the text by the frame's own


def _frame(payload: bytes) -> bytes:
    """A masked text frame with the all-zero key: the payload goes out as it is."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, 0x80 | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    return head + b"\0\0\0\0" + payload


async def _read_http_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """(status, whether the server keeps the connection) after reading the whole answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status, headers.get("connection", "").lower() != "close"


async def tokenize_flood(address: str, token: str, prompt: str, stop: asyncio.Event, seen: Counter) -> None:
    host, port = address.rsplit(":", 1)
    body = json.dumps({"prompt": prompt}).encode()
    request = (f"POST /tokenize HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            keep = True
            while keep and not stop.is_set():
                writer.write(request)
                await writer.drain()
                status, keep = await _read_http_response(reader)
                seen[f"tokenize {status}"] += 1
                if status == 429:  # as the usual flood does
                    await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.IncompleteReadError):
            seen["tokenize connection lost"] += 1
        finally:
            writer.close()


async def _handshake(address: str, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET /ws/v1/generate HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n"
                  f"Origin: http://{address}\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        writer.close()
        return None
    return reader, writer


async def _count_server_frames(reader: asyncio.StreamReader, seen: Counter) -> None:
    """Reads the server's (unmasked) frames until it closes, counting each JSON frame by type and code."""
    while True:
        first, second = await reader.readexactly(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", await reader.readexactly(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", await reader.readexactly(8))[0]
        payload = await reader.readexactly(size)
        if first & 0x0F == 0x8:  # close
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else ""
            seen[f"socket closed {code}"] += 1
            return
        if first & 0x0F == 0x1:
            frame = json.loads(payload)
            seen[f"frame {frame.get('type')} {frame.get('code') or ''}".strip()] += 1


def frame_template(messages: list[dict], schema: Callable[[int], dict]) -> bytes:
    """The generate frame's JSON as the usual flood writes it (`schema` takes the maxLength of its
    fields), with placeholders for the request id and the maxLength."""
    return json.dumps({"type": "generate", "request_id": REQUEST_ID, "messages": messages,
                       "params": {"max_tokens": 1, "temperature": 0, "response_format": schema(MAX_LENGTH)}}).encode()


async def socket_flood(address: str, token: str, template: bytes, first_max_length: int, stop: asyncio.Event,
                       seen: Counter, pairs: int | None = None) -> None:
    """Frame n's schema has maxLength `first_max_length` + n, as in the usual flood: a new one each time.
    With `pairs`, only that many generate and cancel frames are sent; the server's are counted until `stop`."""
    try:
        opened = await _handshake(address, token)
    except (ConnectionError, asyncio.IncompleteReadError):
        opened = None
    if opened is None:
        seen["socket refused"] += 1
        return
    reader, writer = opened
    counter = asyncio.create_task(_count_server_frames(reader, seen))
    placeholder, request_id = str(MAX_LENGTH).encode(), REQUEST_ID.encode()
    sent = 0
    try:
        while not stop.is_set() and not counter.done() and (pairs is None or sent < pairs):
            rid = f"n{sent}".encode()
            generate = template.replace(request_id, rid).replace(placeholder, str(first_max_length + sent).encode())
            writer.write(_frame(generate))
            writer.write(_frame(b'{"type": "cancel", "request_id": "' + rid + b'"}'))
            await writer.drain()
            sent += 1
        while not stop.is_set() and not counter.done():
            await asyncio.sleep(0.05)
    except ConnectionError:
        seen["socket connection lost"] += 1
    finally:
        seen["frames sent"] += 2 * sent
        counter.cancel()
        writer.close()
