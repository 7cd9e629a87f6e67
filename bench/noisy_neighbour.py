"""The noisy neighbour: how much one user's flood of expensive input slows another user's short answer.

    .venv/bin/python bench/noisy_neighbour.py [--requests 12] [--tokenizers 4] [--sockets 4] [--settle 1.0]
                                              [--rounds 1] [--setting NAME ...] [--flood-nice 0]
                                              [--flood-client python|lean]

For each setting in turn (the per-user limits at their defaults, then all three off) it starts a real
Daphne on loopback (tests/cluster.py, in-process engine, the demo model, a fresh database) and measures
user "quiet"'s time to first token: --requests streamed chat completions one after another (greedy, 8
tokens), first on a quiet server, then while user "noisy" floods it (--rounds times in turn):
    --tokenizers clients posting /tokenize with a 250 KB prompt in a loop, and
    --sockets websocket API sockets each sending generate frames as fast as the server takes them, every
    frame carrying 100 KB of messages and a 200-property JSON schema as response_format, a new one each
    time (compiled schemas are cached), each request canceled at once: only the web side's work remains.
The limits in play: WORKBENCH_USER_TOKENIZE_PER_MINUTE, WORKBENCH_USER_SOCKETS,
WORKBENCH_SOCKET_FRAMES_PER_S. Prints, per setting, the quiet user's median and p90 TTFT quiet and flooded
and their ratio (goal: the flooded median within 1.5x of the quiet one), and what the flood got through.
Loopback only, bounded: every flood stops when the quiet user's last request ends, every call has a
30 s limit. The flood runs in a process of its own: in the quiet user's event loop, its own sending
(the JSON of a 100 KB frame, as fast as the loop turns) would delay the quiet user's reads and count
in their times as the server's. It still shares the machine's cores with the server, as a neighbour on
the same host would. --flood-nice N runs the flood's process at that niceness: a stand-in for a flood
from another machine, whose client's own CPU would not be taken from the server's cores (its rate, in
"the flood" line, shows whether it still floods). --flood-client lean sends the same bytes with as
little client CPU as it can (bench/lean_flood.py): the other stand-in, one that keeps the flood's rate.
Both print the flooding process's own CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import openai  # noqa: E402
import websockets  # noqa: E402

from bench import lean_flood  # noqa: E402
from tests.cluster import issue_tokens, start_daphne  # noqa: E402

TIMEOUT_S = 30
SETTINGS = {"limits at their defaults": {},
            "limits off": {"WORKBENCH_USER_TOKENIZE_PER_MINUTE": "0", "WORKBENCH_USER_SOCKETS": "0",
                           "WORKBENCH_SOCKET_FRAMES_PER_S": "0"}}
BIG_PROMPT = "The list type is a mutable sequence of items. " * 5400  # about 250 KB
BIG_MESSAGES = [{"role": "user", "content": "Describe a dictionary in detail. " * 3000}]  # about 100 KB


FIRST_MAX_LENGTH = 40


def big_schema(max_length: int) -> dict:
    """A 200-property JSON schema; each frame's has another `max_length` (the server caches compiled ones)."""
    return {"type": "json_schema", "json_schema": {"name": "wide", "schema": {
        "type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": max_length}
                                         for i in range(200)},
        "required": [f"field_{i}" for i in range(200)], "additionalProperties": False}}}


async def ttft(client: openai.AsyncOpenAI) -> float:
    start = time.perf_counter()
    stream = await client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=8, temperature=0, stream=True)
    first = None
    async for chunk in stream:
        if first is None:
            first = time.perf_counter() - start
    assert first is not None, "no chunk came"
    return first


async def quiet_user(address: str, token: str, requests: int) -> list[float]:
    client = openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key=token, timeout=TIMEOUT_S, max_retries=0)
    try:
        return [await ttft(client) for _ in range(requests)]
    finally:
        await client.close()


async def flood_tokenize(address: str, token: str, stop: asyncio.Event, seen: Counter) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {token}"}) as client:
        while not stop.is_set():
            response = await client.post(f"http://{address}/tokenize", json={"prompt": BIG_PROMPT})
            seen[f"tokenize {response.status_code}"] += 1
            if response.status_code == 429:  # refused: wait as told, as a client that keeps its quota would not
                await asyncio.sleep(0.05)


async def flood_socket(address: str, token: str, stop: asyncio.Event, seen: Counter) -> None:
    try:
        ws = await websockets.connect(f"ws://{address}/ws/v1/generate", open_timeout=TIMEOUT_S, max_size=None,
                                      additional_headers={"Authorization": f"Bearer {token}"})
    except websockets.WebSocketException as exc:
        seen[f"socket refused: {type(exc).__name__}"] += 1
        return

    async def drain() -> None:
        async for message in ws:
            frame = json.loads(message)
            seen[f"frame {frame.get('type')} {frame.get('code') or ''}".strip()] += 1

    reader = asyncio.create_task(drain())
    try:
        sent = 0
        while not stop.is_set() and not reader.done():
            request_id = f"n{sent}"
            params = {"max_tokens": 1, "temperature": 0, "response_format": big_schema(FIRST_MAX_LENGTH + sent)}
            await ws.send(json.dumps({"type": "generate", "request_id": request_id, "messages": BIG_MESSAGES,
                                      "params": params}))
            await ws.send(json.dumps({"type": "cancel", "request_id": request_id}))
            sent += 1
            await asyncio.sleep(0)
        seen["frames sent"] += 2 * sent
    except websockets.ConnectionClosed as exc:
        seen[f"socket closed {exc.rcvd.code if exc.rcvd else ''}"] += 1
    finally:
        reader.cancel()
        await ws.close()


async def flood(address: str, token: str, tokenizers: int, sockets: int, lean: bool, started: Any,
                stop: Any) -> Counter:
    """The noisy user's clients, `started` set once they are, until `stop` is set (multiprocessing Events);
    what they saw, and the CPU and wall time this process spent flooding until then (not its start or its
    clients' closing)."""
    seen: Counter = Counter()
    wall, cpu = time.perf_counter(), time.process_time()
    done = asyncio.Event()
    if lean:
        template = lean_flood.frame_template(BIG_MESSAGES, big_schema)
        floods = [asyncio.create_task(lean_flood.tokenize_flood(address, token, BIG_PROMPT, done, seen))
                  for _ in range(tokenizers)]
        floods += [asyncio.create_task(lean_flood.socket_flood(address, token, template, FIRST_MAX_LENGTH, done, seen))
                   for _ in range(sockets)]
    else:
        floods = [asyncio.create_task(flood_tokenize(address, token, done, seen)) for _ in range(tokenizers)]
        floods += [asyncio.create_task(flood_socket(address, token, done, seen)) for _ in range(sockets)]
    started.set()
    while not stop.is_set():
        await asyncio.sleep(0.05)
    seen["client cpu ms"] = round(1e3 * (time.process_time() - cpu))
    seen["client wall ms"] = round(1e3 * (time.perf_counter() - wall))
    done.set()
    await asyncio.wait(floods, timeout=TIMEOUT_S)
    return seen


def flood_process(address: str, token: str, tokenizers: int, sockets: int, lean: bool, niceness: int, started: Any,
                  stop: Any, results: Any) -> None:
    os.nice(niceness)
    results.put(dict(asyncio.run(flood(address, token, tokenizers, sockets, lean, started, stop))))


async def measure(address: str, tokens: dict[str, str], args: argparse.Namespace) -> list[tuple[list, list, Counter]]:
    """--rounds of (quiet, flooded) on one server: the flood's state moves over seconds (its share of
    the input thread is counted over 10 s, a socket over its frame budget is paused), so one short
    flooded phase reads anywhere in a wide range."""
    return [await measure_round(address, tokens, args) for _ in range(args.rounds)]


async def measure_round(address: str, tokens: dict[str, str], args: argparse.Namespace) -> tuple[list, list, Counter]:
    quiet = await quiet_user(address, tokens["quiet"], args.requests)
    processes = multiprocessing.get_context("spawn")
    started, stop, results = processes.Event(), processes.Event(), processes.Queue()
    noisy = processes.Process(target=flood_process, args=(address, tokens["noisy"], args.tokenizers, args.sockets,
                                                          args.flood_client == "lean", args.flood_nice, started, stop,
                                                          results))
    noisy.start()
    # The process imports for a second or more before it floods: the settling starts when it does.
    if not await asyncio.to_thread(started.wait, TIMEOUT_S):
        noisy.terminate()
        raise RuntimeError("the flood did not start")
    await asyncio.sleep(args.settle)
    try:
        flooded = await asyncio.wait_for(quiet_user(address, tokens["quiet"], args.requests), TIMEOUT_S * args.requests)
    finally:
        stop.set()
        seen = Counter(results.get(timeout=2 * TIMEOUT_S))
        noisy.join(TIMEOUT_S)
    return quiet, flooded, seen


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--tokenizers", type=int, default=4)
    parser.add_argument("--sockets", type=int, default=4)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of flood before the quiet user asks")
    parser.add_argument("--rounds", type=int, default=1, help="quiet and flooded phases, in turn, on each server")
    parser.add_argument("--flood-nice", type=int, default=0, help="the flood process's niceness (0 to 19)")
    parser.add_argument("--flood-client", choices=("python", "lean"), default="python",
                        help="python: httpx and websockets; lean: the same bytes at the least client CPU (bench/lean_flood.py)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), action="append",
                        help="only these settings (repeatable; default: all)")
    args = parser.parse_args()

    for name, limits in SETTINGS.items():
        if args.setting and name not in args.setting:
            continue
        with tempfile.TemporaryDirectory() as workdir:
            env = {"WORKBENCH_SECRET_KEY": secrets.token_urlsafe(50), **os.environ, "WORKBENCH_TRANSPORT": "inprocess",
                   "WORKBENCH_MODEL": "demo", **limits}
            db = Path(workdir) / "noisy.sqlite3"
            server, address, _ = start_daphne(env, db)
            try:
                tokens = issue_tokens(env, db, ["quiet", "noisy"])
                rounds = asyncio.run(measure(address, tokens, args))
            finally:
                server.terminate()
                server.wait(timeout=TIMEOUT_S)
        quiet = [t for round_quiet, _, _ in rounds for t in round_quiet]
        flooded = [t for _, round_flooded, _ in rounds for t in round_flooded]
        seen = sum((round_seen for _, _, round_seen in rounds), Counter())
        ratio = statistics.median(flooded) / statistics.median(quiet)
        print(f"{name}: quiet user's TTFT median {statistics.median(quiet) * 1e3:.0f} ms (p90 "
              f"{p90(quiet) * 1e3:.0f}), flooded {statistics.median(flooded) * 1e3:.0f} ms (p90 "
              f"{p90(flooded) * 1e3:.0f}): {ratio:.2f}x")
        if len(rounds) > 1:
            each = [statistics.median(f) / statistics.median(q) for q, f, _ in rounds]
            print(f"  each round: {', '.join(f'{r:.2f}x' for r in each)}")
        client_cpu, client_wall = seen.pop("client cpu ms"), seen.pop("client wall ms")
        print(f"  the flood: {dict(sorted(seen.items()))}")
        print(f"  the flooding client's CPU: {client_cpu / 1e3:.1f} s over {client_wall / 1e3:.1f} s "
              f"({100 * client_cpu / client_wall:.0f}% of a core)")


if __name__ == "__main__":
    main()
