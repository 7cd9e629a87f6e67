"""bench/lean_flood.py writes HTTP and websocket frames by hand (a kept-alive POST written again and
again, text frames masked with the all-zero key): a real Daphne must read them as the usual clients'.
A frame it could not read would close the socket (counted as "socket closed"), a request it could not
parse would get no 200, so a flood that only looked busy fails here."""

from __future__ import annotations

import asyncio
from collections import Counter

from bench import lean_flood
from tests.cluster import issue_tokens
from tests.users import unique_name
from tests.waiting import async_wait_until

SMALL_MESSAGES = [{"role": "user", "content": "Hi"}]
PAIRS = 3  # generate and cancel frames: each request accepted, then ended (canceled, or done first)


def small_schema(max_length: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "one", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "maxLength": max_length}}, "required": ["a"]}}}


async def flood_until_answered(address: str, token: str) -> Counter:
    seen: Counter = Counter()
    stop = asyncio.Event()
    template = lean_flood.frame_template(SMALL_MESSAGES, small_schema)
    floods = [asyncio.create_task(lean_flood.tokenize_flood(address, token, "Hello there " * 200, stop, seen)),
              asyncio.create_task(lean_flood.socket_flood(address, token, template, 5, stop, seen, pairs=PAIRS))]
    try:
        await async_wait_until(lambda: seen["tokenize 200"] >= 2 and seen["frame done"] == PAIRS, 30,
                               "two answered /tokenize calls and every generate frame's request ended")
    finally:
        stop.set()
        await asyncio.wait(floods, timeout=30)
    return seen


def test_the_lean_floods_requests_and_frames_are_read_as_any_clients(inprocess_daphne):
    token = next(iter(issue_tokens(inprocess_daphne.env, inprocess_daphne.db_path, [unique_name("flooder")]).values()))
    seen = asyncio.run(flood_until_answered(inprocess_daphne.address, token))
    assert {key for key in seen if key.startswith("tokenize")} <= {"tokenize 200", "tokenize 429"}, seen
    assert not [key for key in seen if key.startswith("socket")], seen  # never refused, closed or cut
    assert seen["frames sent"] == 2 * PAIRS and seen["frame accepted"] == PAIRS, seen
