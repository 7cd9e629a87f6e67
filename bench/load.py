"""Load with a leak oracle: N concurrent clients over the websocket API and the OpenAI API, each answer
compared with the same request run alone.

    .venv/bin/python bench/load.py [--clients 64] [--requests-per-client 2] [--users 16] [--seed 0]
                                   [--max-tokens 48] [--address HOST:PORT --tokens FILE]

Without --address it starts a real in-process Daphne (as deployments start it, workbench/serve.py) over
a fresh database, with tokens for --users users and the per-user limits off, on loopback only. Each
request has a distinct prompt, greedy or seeded sampling, sometimes a stop string, and a max_tokens
from 4 to --max-tokens; about 30% are canceled mid-stream, 10% drop their connection abruptly, 5% read slowly.
Then, for every request: a completed answer must equal its solo run (token ids on the websocket API,
text on the OpenAI API), a canceled or dropped one must be a prefix of it, and every websocket delta's
index must continue where the last ended. Prints requests, tokens, mismatches, offset gaps, errors by
code, TTFT and ITL percentiles; exits 1 on any mismatch, gap or unanswered request. Bounded: every
receive has a 60 s limit. tests/workbench/test_load.py runs it small.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402
import websockets  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

BASES = ["The list type", "A dictionary is", "This module provides", "Return the number of",
         "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has"]
RECEIVE_S = 60.0


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


@dataclass
class Result:
    spec: Spec
    ending: str = "unanswered"  # done / canceled / dropped / error:<code> / unanswered
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    gaps: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)


def specs(clients: int, per_client: int, users: list[str], seed: int, max_tokens: int = 48) -> list[list[Spec]]:
    rng = random.Random(seed)
    plan = []
    for client in range(clients):
        mine = []
        for k in range(per_client):
            number = client * per_client + k
            params: dict = {"max_tokens": rng.randint(4, max(4, max_tokens)), "ignore_eos": True}
            params.update({"temperature": 0} if rng.random() < 0.5 else {"temperature": 0.8, "seed": rng.randint(0, 9999)})
            if rng.random() < 0.2:
                params["stop"] = ["."]
            roll = rng.random()
            behaviour = "cancel" if roll < 0.30 else "drop" if roll < 0.40 else "slow" if roll < 0.45 else "read"
            mine.append(Spec(number, "ws" if client % 2 == 0 else "openai", users[client % len(users)],
                             f"{BASES[number % len(BASES)]} (request {number})", params, behaviour, rng.randint(1, 3)))
        plan.append(mine)
    return plan


def solo(all_specs: list[Spec]) -> dict[int, tuple[list[int], str]]:
    """Each request alone on an engine of its own process: the oracle's answers."""
    engine = Engine(EngineConfig(model="demo"))
    answers = {}
    for spec in all_specs:
        out = engine.generate([spec.prompt], SamplingParams(**spec.params))[0]
        answers[spec.number] = (list(out.token_ids), out.text)
    return answers


async def run_ws(address: str, token: str, spec: Spec) -> Result:
    result, request_id = Result(spec), f"r{spec.number}"
    started = time.monotonic()
    last = started
    async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                  additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": spec.prompt,
                                  "params": spec.params}))
        deltas = 0
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_S))
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
                result.ending = f"error:{frame['code']}"
                return result


async def run_openai(address: str, token: str, spec: Spec) -> Result:
    result = Result(spec)
    client = openai.AsyncOpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0, timeout=RECEIVE_S)
    extra = {"ignore_eos": True}
    kwargs = {k: v for k, v in spec.params.items() if k != "ignore_eos"}
    started = time.monotonic()
    last, chunks = started, 0
    try:
        stream = await client.completions.create(model="demo", prompt=spec.prompt, stream=True, extra_body=extra, **kwargs)
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
    except openai.APIStatusError as exc:
        result.ending = f"error:{(exc.body or {}).get('code') if isinstance(exc.body, dict) else exc.status_code}"
    finally:
        await client.close()
    return result


async def load(address: str, tokens: dict[str, str], plan: list[list[Spec]]) -> list[Result]:
    async def client(mine: list[Spec]) -> list[Result]:
        done = []
        for spec in mine:
            run = run_ws if spec.api == "ws" else run_openai
            try:
                done.append(await run(address, tokens[spec.user], spec))
            except Exception as exc:  # a client that got no answer is counted, not fatal to the run
                done.append(Result(spec, ending=f"unanswered:{type(exc).__name__}"))
        return done

    return [r for rs in await asyncio.gather(*(client(m) for m in plan)) for r in rs]


def judge(results: list[Result], answers: dict[int, tuple[list[int], str]]) -> dict:
    """The oracle: per request, what it got against what it gets alone."""
    mismatches, endings = [], Counter(r.ending for r in results)
    for r in results:
        ids, text = answers[r.spec.number]
        got, want = (r.token_ids, ids) if r.spec.api == "ws" else (r.text, text)
        complete = r.ending == "done"
        if (complete and got != want) or (not complete and r.ending in ("canceled", "dropped")
                                          and want[:len(got)] != got):
            mismatches.append(r.spec.number)
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    itls = sorted(i for r in results for i in r.itls)
    return {"requests": len(results), "tokens": sum(len(r.token_ids) for r in results), "endings": dict(endings),
            "mismatches": mismatches, "offset_gaps": sum(r.gaps for r in results),
            "unanswered": sum(n for e, n in endings.items() if e.startswith("unanswered")),
            "ttft_ms": {q: round(1000 * pct(ttfts, q), 1) for q in (50, 90, 99)},
            "itl_ms": {q: round(1000 * pct(itls, q), 1) for q in (50, 90, 99)}}


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q / 100))] if values else float("nan")


def own_server(workdir: Path, users: list[str]) -> tuple[object, str, dict[str, str]]:
    from tests.cluster import issue_tokens, start_daphne

    env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess", "WORKBENCH_USER_CONCURRENT_REQUESTS": "0",
           "WORKBENCH_USER_REQUESTS_PER_MINUTE": "0"}
    env.setdefault("WORKBENCH_SECRET_KEY", "bench-load-only-" + "x" * 40)
    server, address, _ = start_daphne(env, workdir / "db.sqlite3")
    return server, address, issue_tokens(env, workdir / "db.sqlite3", users)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=48, help="each request's max_tokens is 4 to this")
    parser.add_argument("--address", help="a running server (loopback); needs --tokens")
    parser.add_argument("--tokens", help="a JSON file {username: token} for --address")
    args = parser.parse_args(argv)
    users = [f"load{i}" for i in range(args.users)]
    server = None
    with tempfile.TemporaryDirectory() as workdir:
        if args.address:
            address, tokens = args.address, json.loads(Path(args.tokens).read_text())
            users = sorted(tokens)
        else:
            server, address, tokens = own_server(Path(workdir), users)
        try:
            plan = specs(args.clients, args.requests_per_client, users, args.seed, args.max_tokens)
            started = time.monotonic()
            results = asyncio.run(load(address, tokens, plan))
            wall = time.monotonic() - started
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
    report = judge(results, solo([s for mine in plan for s in mine]))
    report["wall_s"] = round(wall, 1)
    print(json.dumps(report, indent=1))
    return 1 if report["mismatches"] or report["offset_gaps"] or report["unanswered"] else 0


if __name__ == "__main__":
    sys.exit(main())
