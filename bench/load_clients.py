"""The load's clients (bench/load.py): what each request asks and how its client behaves, and the clients
themselves over the websocket API and the OpenAI API, on loopback, every receive bounded.

A plan is one list of requests per client; `load` runs each client's list in order, all clients at once.
`soak` repeats the plans until a deadline, pausing every client between two requests whenever a
checkpoint wants the server idle (bench/soak.py samples it then).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import openai
import websockets

BASES = ["The list type", "A dictionary is", "This module provides", "Return the number of",
         "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has"]
RECEIVE_S = 60.0  # no client waits longer than this for its next frame or chunk


@dataclass
class Spec:
    """One request: what it asks and how its client behaves."""
    number: int
    api: str  # "ws" or "openai"
    user: str
    prompt: str
    params: dict
    behaviour: str  # "read", "cancel", "drop", "slow"
    after: int  # deltas read before a cancel or drop

    @property
    def greedy(self) -> bool:
        return self.params.get("temperature") == 0


@dataclass
class Result:
    spec: Spec
    ending: str = "unanswered"  # done / canceled / dropped / error:<code> / unanswered:<exception>
    message: str = ""  # an error's message, as the server wrote it
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    gaps: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)


def specs(clients: int, per_client: int, users: list[str], seed: int, max_tokens: int = 48,
          first_number: int = 0, greedy_share: float = 0.5) -> list[list[Spec]]:
    """Per client, `per_client` requests: distinct prompts, greedy (a `greedy_share` of them) or seeded,
    sometimes a stop string, max_tokens 4..`max_tokens`; ~30% cancel, ~10% drop, ~5% read slowly.
    Numbers start at `first_number`. The device loop bursts only a decode batch whose every row is
    greedy (engine/decode/device_loop.py can_burst), so the share decides how often it acts."""
    rng = random.Random(seed)
    plan = []
    for client in range(clients):
        mine = []
        for k in range(per_client):
            number = first_number + client * per_client + k
            params: dict = {"max_tokens": rng.randint(4, max(4, max_tokens)), "ignore_eos": True}
            greedy = rng.random() < greedy_share
            params.update({"temperature": 0} if greedy else {"temperature": 0.8, "seed": rng.randint(0, 9999)})
            if rng.random() < 0.2:
                params["stop"] = ["."]
            roll = rng.random()
            behaviour = "cancel" if roll < 0.30 else "drop" if roll < 0.40 else "slow" if roll < 0.45 else "read"
            mine.append(Spec(number, "ws" if client % 2 == 0 else "openai", users[client % len(users)],
                             f"{BASES[number % len(BASES)]} (request {number})", params, behaviour, rng.randint(1, 3)))
        plan.append(mine)
    return plan


class ConnectTimeout(TimeoutError):
    """No websocket handshake within RECEIVE_S."""


class ReceiveTimeout(TimeoutError):
    """Connected, but no frame within RECEIVE_S."""


async def receive(ws) -> dict:
    try:
        return json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_S))
    except TimeoutError:
        raise ReceiveTimeout(f"no frame within {RECEIVE_S} s") from None


async def run_ws(address: str, token: str, spec: Spec) -> Result:
    result, request_id = Result(spec), f"r{spec.number}"
    started = time.monotonic()
    last = started
    try:
        ws = await websockets.connect(f"ws://{address}/ws/v1/generate", open_timeout=RECEIVE_S,
                                      additional_headers={"Authorization": f"Bearer {token}"})
    except TimeoutError:
        raise ConnectTimeout(f"no handshake within {RECEIVE_S} s") from None
    async with ws:
        await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": spec.prompt,
                                  "params": spec.params}))
        deltas = 0
        while True:
            frame = await receive(ws)
            now = time.monotonic()
            if frame["type"] == "delta":
                if frame["index"] != len(result.token_ids):
                    result.gaps += 1
                if result.ttft is None:
                    result.ttft = now - started
                elif frame["token_ids"]:
                    result.itls.append((now - last) / len(frame["token_ids"]))
                last = now
                result.token_ids += frame["token_ids"]
                result.text += frame["text"]
                deltas += 1
                if deltas == spec.after and spec.behaviour == "cancel":
                    await ws.send(json.dumps({"type": "cancel", "request_id": request_id}))
                elif deltas == spec.after and spec.behaviour == "drop":
                    ws.transport.abort()  # no close frame: the server sees the connection vanish
                    result.ending = "dropped"
                    return result
                if spec.behaviour == "slow":
                    await asyncio.sleep(0.05)
            elif frame["type"] == "done":
                result.ending = "canceled" if frame["finish_reason"] == "canceled" else "done"
                return result
            elif frame["type"] == "error":
                result.ending, result.message = f"error:{frame['code']}", frame.get("message", "")
                return result


async def run_openai(address: str, token: str, spec: Spec, model: str = "demo") -> Result:
    result = Result(spec)
    client = openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0, timeout=RECEIVE_S)
    extra = {"ignore_eos": True}
    kwargs = {k: v for k, v in spec.params.items() if k != "ignore_eos"}
    started = time.monotonic()
    last, chunks = started, 0
    try:
        stream = await client.completions.create(model=model, prompt=spec.prompt, stream=True, extra_body=extra, **kwargs)
        async for chunk in stream:
            text = chunk.choices[0].text if chunk.choices else ""
            if not text:
                continue
            now = time.monotonic()
            if result.ttft is None:
                result.ttft = now - started
            else:
                result.itls.append(now - last)
            last, chunks = now, chunks + 1
            result.text += text
            if chunks == spec.after and spec.behaviour in ("cancel", "drop"):
                await stream.close()  # HTTP has no cancel frame: going away is the cancel
                result.ending = "canceled" if spec.behaviour == "cancel" else "dropped"
                return result
            if spec.behaviour == "slow":
                await asyncio.sleep(0.05)
        result.ending = "done"
    except openai.APIConnectionError:
        raise  # no answer at all (a timeout among them): counted as unanswered
    except openai.APIError as exc:  # a refusal (APIStatusError), or an error event in the stream
        body = exc.body if isinstance(exc.body, dict) else {}
        result.ending = f"error:{body.get('code') or getattr(exc, 'status_code', None) or type(exc).__name__}"
        result.message = str(body.get("message", exc))
    finally:
        await client.close()
    return result


async def run_one(address: str, tokens: dict[str, str], spec: Spec, model: str = "demo") -> Result:
    """`model`: the served model's name, which the OpenAI API checks (the websocket API takes none)."""
    try:
        if spec.api == "ws":
            return await run_ws(address, tokens[spec.user], spec)
        return await run_openai(address, tokens[spec.user], spec, model)
    except Exception as exc:  # a client that got no answer is counted, not fatal to the run
        return Result(spec, ending=f"unanswered:{spec.api}:{type(exc).__name__}", message=str(exc)[:200])


async def load(address: str, tokens: dict[str, str], plan: list[list[Spec]], model: str = "demo") -> list[Result]:
    async def client(mine: list[Spec]) -> list[Result]:
        return [await run_one(address, tokens, spec, model) for spec in mine]

    return [r for rs in await asyncio.gather(*(client(m) for m in plan)) for r in rs]


async def soak(address: str, tokens: dict[str, str], plans: list[list[list[Spec]]], seconds: float,
               interval: float, checkpoint: Callable[[], Awaitable[None]], model: str = "demo") -> list[Result]:
    """Every client runs its requests of plans[0], then of plans[1], ... round and round until `seconds`
    have passed. Every `interval` s (and at the end) the clients pause before their next request and,
    once none has a request under way, `checkpoint()` runs; then they go on. Bounded: a client's request
    is bounded by RECEIVE_S per frame and the run ends at the deadline plus one request per client."""
    deadline = time.monotonic() + seconds
    going = asyncio.Event()
    going.set()
    under_way = 0
    idle = asyncio.Event()
    results: list[Result] = []

    async def client(number: int) -> None:
        nonlocal under_way
        round_ = 0
        while time.monotonic() < deadline:
            for spec in plans[round_ % len(plans)][number]:
                await going.wait()
                if time.monotonic() >= deadline:
                    return
                under_way += 1
                idle.clear()
                try:
                    results.append(await run_one(address, tokens, spec, model))
                finally:
                    under_way -= 1
                    if under_way == 0:
                        idle.set()
            round_ += 1

    async def pause_and_check() -> None:
        going.clear()
        if under_way:
            await idle.wait()
        await checkpoint()
        going.set()

    clients = [asyncio.create_task(client(n)) for n in range(len(plans[0]))]
    while time.monotonic() + interval < deadline:
        await asyncio.sleep(interval)
        await pause_and_check()
    await asyncio.gather(*clients)
    await checkpoint()
    return results
