"""The busy server's workload through our own sockets: the websocket API and the chat page's socket.

bench/busy_server.py --sockets runs these after vLLM's client at each client count, against the same
server: every client its own user (an API token for /ws/v1/generate, a signed-in session for
/ws/chat/<id>), as many users as clients, so no per-user limit is in play that the HTTP run does not
meet. The prompts are made as the engine-alone run makes them, with seeds of their own (a prompt sent
twice would be prefilled from the prefix cache): random token ids decoded with the served tokenizer,
sent as one user message that the server renders with the chat template; the output generated with
EOS ignored, temperature 1 with a seed per request.

The websocket API client sends each request on its one socket, one after another. The chat client
opens the chat socket of a fresh conversation for each request (a reply in a conversation that already
has one would be asked with a longer prompt), as the page does when a user opens a new chat.

Figures in the keys of vLLM's saved result, measured as its client measures them: time to first token
from the send to the first delta, inter-token latency between two deltas whatever each carries (vLLM
takes each streamed chunk as one gap), time per output token over each request's decode, throughput as
every completed token over the run's wall time.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import websockets

RECEIVE_S = 600.0  # a 32-client wave on a slow machine may keep a request queued for minutes


@dataclass
class Account:
    """One client's user: an API token, a session cookie and fresh conversations that user owns."""
    token: str
    session: str
    conversations: list[int]


@dataclass
class Timeline:
    """One request as its client saw it."""
    sent: float
    chunks: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def accounts(env: dict, db_path: Path, users: int, conversations_each: int) -> list[Account]:
    """`users` users (made if absent) in the database Daphne serves at `db_path`, each with a new API
    token, a new signed-in session and `conversations_each` new conversations: made in one process."""
    script = (
        "from django.contrib.auth import get_user_model; from django.test import Client\n"
        "from workbench.api.models import ApiToken; from workbench.chat.models import Conversation\n"
        "users, each = int(sys.argv[1]), int(sys.argv[2])\n"
        "for n in range(users):\n"
        "    user = get_user_model().objects.get_or_create(username=f'busy{n}')[0]\n"
        "    client = Client(); client.force_login(user)\n"
        "    ids = [Conversation.objects.create(owner=user).pk for _ in range(each)]\n"
        "    print(ApiToken.issue(user, 'busy-server bench')[1], client.cookies['sessionid'].value, *ids)")
    from tests.cluster import django_script

    out = django_script(env, db_path, script, str(users), str(conversations_each))
    return [Account(fields[0], fields[1], [int(pk) for pk in fields[2:]])
            for fields in (line.split() for line in out.strip().splitlines())]


def random_prompts(tokenizer, count: int, length: int, seed: int) -> list[str]:
    """`count` texts, each `length` random token ids of `tokenizer`'s vocabulary decoded."""
    draw = random.Random(seed)
    return [tokenizer.decode([draw.randrange(tokenizer.vocab_size) for _ in range(length)]) for _ in range(count)]


def params_for(number: int, output_len: int) -> dict:
    return {"max_tokens": output_len, "ignore_eos": True, "temperature": 1.0, "seed": number}


async def api_client(address: str, account: Account, mine: list[tuple[int, str]], output_len: int,
                     timelines: list[Timeline]) -> None:
    """One user's requests on one websocket API socket, one after another."""
    async with websockets.connect(f"ws://{address}/ws/v1/generate", max_size=None,
                                  additional_headers={"Authorization": f"Bearer {account.token}"}) as ws:
        for number, prompt in mine:
            line = Timeline(time.perf_counter())
            timelines.append(line)
            await ws.send(json.dumps({"type": "generate", "request_id": str(number), "params": params_for(number, output_len),
                                      "messages": [{"role": "user", "content": prompt}]}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_S))
                if frame["type"] == "delta":
                    line.chunks.append(time.perf_counter())
                    line.tokens += len(frame["token_ids"])
                elif frame["type"] == "done":
                    break
                elif frame["type"] == "error":
                    line.error = frame["code"]
                    break


async def chat_client(address: str, account: Account, mine: list[tuple[int, str]], output_len: int,
                      timelines: list[Timeline]) -> None:
    """One user's requests, each in a fresh conversation of theirs through its chat socket."""
    for (number, prompt), conversation in zip(mine, account.conversations, strict=False):
        async with websockets.connect(f"ws://{address}/ws/chat/{conversation}", max_size=None,
                                      additional_headers={"Cookie": f"sessionid={account.session}"}) as ws:
            line = Timeline(time.perf_counter())
            timelines.append(line)
            await ws.send(json.dumps({"type": "send", "content": prompt, "params": params_for(number, output_len)}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_S))
                if frame["type"] == "delta":
                    line.chunks.append(time.perf_counter())
                elif frame["type"] == "done":
                    line.tokens = (frame.get("usage") or {}).get("completion_tokens", 0)
                    line.error = frame.get("error") or ""
                    break
                elif frame["type"] == "error":
                    line.error = frame["code"]
                    break


def run(kind: str, address: str, users: list[Account], prompts: list[str], output_len: int) -> dict:
    """All of `prompts` through `kind` ("ws" or "chat"), one client per account, the prompts dealt out
    in turn; the figures in the keys of vLLM's saved result."""
    client = {"ws": api_client, "chat": chat_client}[kind]
    dealt = [[(n, p) for n, p in enumerate(prompts) if n % len(users) == i] for i in range(len(users))]
    timelines: list[Timeline] = []

    async def everyone() -> None:
        await asyncio.gather(*(client(address, account, mine, output_len, timelines)
                               for account, mine in zip(users, dealt, strict=True)))

    began = time.perf_counter()
    asyncio.run(everyone())
    return figures(timelines, time.perf_counter() - began)


def figures(timelines: list[Timeline], seconds: float) -> dict:
    """vLLM's result keys (ms; throughput over `seconds`) from the requests that completed without error."""
    done = [t for t in timelines if not t.error and t.chunks]
    ttfts = [(t.chunks[0] - t.sent) * 1e3 for t in done]
    itls = [(b - a) * 1e3 for t in done for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    tpots = [(t.chunks[-1] - t.chunks[0]) * 1e3 / (t.tokens - 1) for t in done if t.tokens > 1]
    return {"output_throughput": sum(t.tokens for t in done) / seconds, "completed": len(done),
            "failed": len(timelines) - len(done), "median_ttft_ms": median(ttfts), "p99_ttft_ms": p99(ttfts),
            "median_tpot_ms": median(tpots), "median_itl_ms": median(itls), "p99_itl_ms": p99(itls)}


def median(values: list[float]) -> float:
    return float(numpy.median(values)) if values else math.nan


def p99(values: list[float]) -> float:
    """The 99th percentile as vLLM's client computes it (numpy's default interpolation)."""
    return float(numpy.percentile(values, 99)) if values else math.nan
