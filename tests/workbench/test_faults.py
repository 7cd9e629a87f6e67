"""Fault injection on the multi-process stack: real Redis (a private redis-server, so it can be
stopped), two real Celery workers (tests/fault_worker.py: the workbench worker with a poisoned-prompt
forward hook and a small KV pool), a real Daphne, clients over loopback websockets.

For each fault: what the client sees (an error frame within 10 s, never a hang), what is stored (the
chat reply, or nothing), that nothing is run twice or mixed (every completed answer equals its solo
run, every cut one is a prefix of it, offsets contiguous; no request admitted twice), and that the
stack serves again by itself (a fresh request succeeds). Each test runs its fault twice in a row.
One stack for the module: the faults run one after another on the same processes. docs/RELIABILITY.md
("Faults") has the table of what each does from the client's side.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import websockets

from tests.cluster import Cluster, RedisServer, operator_session
from tests.reference import greedy_solos
# Heartbeats twice as often and a worker lost after half the default time (the web side and the workers
# read both): a fault's clients hear of a lost worker about 2 s sooner, every round. The liveness tests
# hold the grace periods at these values.
from tests.workbench.test_worker_liveness import HEARTBEAT_S, LOST_S
from tests.waiting import async_wait_until
from workbench.serving.celery.presence import WORKER_KEY, Heartbeat

POISON = "poisoned row"  # tests/fault_worker.py's forward raises for a batch holding a prompt with this
KV_BLOCKS = 5  # per worker: 80 tokens of KV, a few requests' worth (the preemption storm's pool)
MAX_TOKENS = 16
STEP_S = 0.03  # each step of the fault workers at least this long: 16 tokens stay in flight for half a second
PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
           "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has",
           "The result is a", "Open the file and"]
ERROR_WITHIN_S = 10.0


@dataclass
class Answer:
    """One request as its client saw it."""
    tokens: list[int] = field(default_factory=list)
    gaps: int = 0  # deltas whose index did not continue where the last one ended
    end: dict | None = None  # its done or error frame
    ended_at: float = 0.0

    @property
    def error(self) -> str | None:
        return self.end["code"] if self.end and self.end["type"] == "error" else None


@dataclass
class Stack:
    cluster: Cluster
    redis_server: RedisServer
    address: str
    token: str
    session: str  # a staff operator's session cookie (chat pages and the dashboard)
    conversations: list[int]
    db_path: Path
    solo: dict[str, list[int]]

    def api(self, **options):
        return websockets.connect(f"ws://{self.address}/ws/v1/generate",
                                  additional_headers={"Authorization": f"Bearer {self.token}"}, **options)

    def with_session(self, path: str):
        return websockets.connect(f"ws://{self.address}{path}", additional_headers={"Cookie": f"sessionid={self.session}"})

    def heartbeats(self) -> dict[str, Heartbeat]:
        client = redis.Redis.from_url(self.redis_server.url, socket_connect_timeout=1)
        keys = list(client.scan_iter(match=WORKER_KEY.format(prefix=self.cluster.prefix, worker_id="*")))
        beats = [Heartbeat.from_json(raw) for raw in client.mget(keys) if raw] if keys else []
        return {beat.worker_id: beat for beat in beats}

    def holder(self, request_id: str) -> str | None:
        """The worker holding the request (its engine id ends "-<request id>.<suffix>")."""
        for worker_id, beat in self.heartbeats().items():
            if any(f"-{request_id}." in held for held in beat.requests):
                return worker_id
        return None

    def stored_replies(self, conversation: int) -> list[tuple[str, str, str]]:
        with sqlite3.connect(self.db_path) as db:
            return db.execute("SELECT content, finish_reason, error FROM chat_message WHERE conversation_id = ? "
                              "AND role = 'assistant' ORDER BY id", (conversation,)).fetchall()

    def metric(self, name: str) -> int:
        """A counter summed over the live workers' heartbeats (workbench/serving/metrics.py)."""
        return sum(int(beat.metrics.get(name, 0)) for beat in self.heartbeats().values())

    def nothing_twice(self) -> None:
        admissions = self.cluster.admissions()
        assert admissions and all(len(workers) == 1 for workers in admissions.values()), admissions


def generate(request_id: str, prompt: str, max_tokens: int = MAX_TOKENS, **params) -> str:
    return json.dumps({"type": "generate", "request_id": request_id, "prompt": prompt,
                       "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **params}})


async def answers(ws, request_ids, timeout: float = 60) -> dict[str, Answer]:
    """Read `ws` until each of `request_ids` ended (done or error)."""
    got = {rid: Answer() for rid in request_ids}
    while any(a.end is None for a in got.values()):
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        answer = got.get(frame.get("request_id"))
        if answer is None:
            continue
        if frame["type"] == "delta":
            answer.gaps += frame["index"] != len(answer.tokens)
            answer.tokens += frame["token_ids"]
        elif frame["type"] in ("done", "error"):
            answer.end, answer.ended_at = frame, time.monotonic()
    return got


async def ask(stack: Stack, requests: dict[str, str], timeout: float = 60) -> dict[str, Answer]:
    async with stack.api() as ws:
        for rid, prompt in requests.items():
            await ws.send(generate(rid, prompt))
        return await answers(ws, requests, timeout)


def assert_solo(stack: Stack, requests: dict[str, str], got: dict[str, Answer], may_fail: set[str] = frozenset(),
                code: str | None = None) -> None:
    """Completed answers equal their solo runs; those in `may_fail` may instead end with error `code`,
    having streamed a prefix of it."""
    for rid, prompt in requests.items():
        answer, solo = got[rid], stack.solo[prompt]
        assert answer.gaps == 0, f"{rid}: offset gap"
        if answer.error and rid in may_fail:
            assert answer.error == code and answer.tokens == solo[:len(answer.tokens)], (rid, answer)
        else:
            assert answer.end and answer.end["type"] == "done", (rid, answer.end)
            assert answer.tokens == solo, f"{rid} differs from its solo run"


def serves_again(stack: Stack, tag: str, timeout: float = 30) -> None:
    """A fresh request succeeds without anyone repairing anything (retried while the stack recovers)."""
    deadline = time.monotonic() + timeout
    while True:
        got = asyncio.run(ask(stack, {f"fresh-{tag}": PROMPTS[0]}))[f"fresh-{tag}"]
        if got.end["type"] == "done" or time.monotonic() > deadline:
            break
        assert got.error in ("unavailable", "worker_lost", "overloaded"), got.end
        time.sleep(0.5)
    assert got.end["type"] == "done" and got.tokens == stack.solo[PROMPTS[0]], got.end


def solo_runs() -> dict[str, list[int]]:
    """Each prompt's solo tokens (tests/reference.py: the demo model with its default, large, pool): the oracle."""
    return dict(zip(PROMPTS, greedy_solos(PROMPTS, MAX_TOKENS)))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("faults")
    with ThreadPoolExecutor(1) as pool:
        solo = pool.submit(solo_runs)  # while the workers load
        redis_server = RedisServer().start()
        cluster = Cluster(redis_server.url, log_dir, app="tests.fault_worker", FAULT_POISON=POISON,
                          FAULT_KV_BLOCKS=KV_BLOCKS, FAULT_STEP_S=STEP_S, ARC_GRAPH_DEVICE_LOOP=1,
                          WORKBENCH_HEARTBEAT_S=HEARTBEAT_S, WORKBENCH_WORKER_LOST_S=LOST_S)
        try:
            cluster.start_workers(2)
            db_path = log_dir / "db.sqlite3"
            address, token = cluster.start_daphne(db_path)
            session, conversations = operator_session(cluster.env, db_path, 6)
            yield Stack(cluster, redis_server, address, token, session, conversations, db_path, solo.result())
        finally:
            cluster.stop()
            redis_server.stop()


async def chat_send(ws, content: str, max_tokens: int) -> None:
    await ws.send(json.dumps({"type": "send", "content": content,
                              "params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}))


async def chat_until_done(ws, timeout: float = 60) -> tuple[str, dict]:
    """The streamed text and the done frame of a reply under way."""
    text = ""
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if frame["type"] == "delta":
            text += frame["text"]
        elif frame["type"] == "done":
            return text, frame


# -- 1. a worker SIGKILLed mid-stream, and a new one started --------------------------------------

def test_a_worker_killed_mid_stream_twice(stack):
    for round_ in range(2):
        asyncio.run(_kill_a_worker(stack, round_))
        stack.nothing_twice()
        serves_again(stack, f"kill{round_}")


async def _kill_a_worker(stack: Stack, round_: int) -> None:
    conversation = stack.conversations[round_]
    requests = {f"k{round_}-{i}": PROMPTS[i] for i in range(3)}
    async with stack.with_session(f"/ws/chat/{conversation}") as chat, stack.api() as api:
        # Long enough to be mid-stream when the kill comes, even on a fast machine (48 tokens could end
        # before every request shows in a heartbeat).
        await chat_send(chat, "Tell me about lists", 400)
        assert json.loads(await chat.recv())["type"] == "started"
        for rid, prompt in requests.items():
            await api.send(generate(rid, prompt))
        first = json.loads(await asyncio.wait_for(chat.recv(), 30))
        assert first["type"] == "delta", first
        await async_wait_until(lambda: _chat_holder(stack) and all(stack.holder(rid) for rid in requests), 15,
                               "a worker to hold the chat and every request")
        victim_id = _chat_holder(stack)
        on_victim = {rid for rid in requests if stack.holder(rid) == victim_id}
        victim = next(p for p in stack.cluster.workers if p.poll() is None and stack.cluster.worker_id(p) == victim_id)
        stack.cluster.kill(victim)
        killed_at = time.monotonic()
        # The replacement starts at once, as its supervisor would start it, while the clients wait for
        # the loss to be noticed (the workers' lost-after, seconds).
        replacement = asyncio.create_task(asyncio.to_thread(stack.cluster.start_workers, 1))

        text, done = await chat_until_done(chat)
        assert time.monotonic() - killed_at < ERROR_WITHIN_S, "the chat client waited too long for its error"
        assert done["finish_reason"] == "error" and "worker" in done["error"]
        streamed = first["text"] + text
        assert stack.stored_replies(conversation) == [(streamed, "error", done["error"])], "stored as streamed"

        got = await answers(api, requests)
        for rid in on_victim:
            if got[rid].error:
                assert got[rid].ended_at - killed_at < ERROR_WITHIN_S, f"{rid} waited too long"
        assert_solo(stack, requests, got, may_fail=on_victim, code="worker_lost")
        assert not any(got[rid].error for rid in set(requests) - on_victim), "the other worker's requests were hurt"
        await replacement


def _chat_holder(stack: Stack) -> str | None:
    for worker_id, beat in stack.heartbeats().items():
        if any(held.startswith("chat-") for held in beat.requests):
            return worker_id
    return None


# -- 2. Redis stopped and started ---------------------------------------------------------------

def test_redis_stopped_and_started_twice(stack):
    alive = [p for p in stack.cluster.workers if p.poll() is None]
    for round_ in range(2):
        asyncio.run(_redis_away(stack, round_))
        serves_again(stack, f"redis{round_}", timeout=40)
        stack.nothing_twice()
    # The same web process and workers serve again: none restarted, none started.
    assert stack.cluster.daphne.poll() is None and all(p.poll() is None for p in alive)
    assert [p for p in stack.cluster.workers if p.poll() is None] == alive
    # Each worker's consumer tried Redis again every second (workbench/serving/celery/broker_reconnect.py),
    # not after Celery's 2, 4, 6... s: a worker is back within a second of Redis.
    for process in alive:
        pauses = re.findall(r"Trying again in (.*?)\.\.\.", Path(process.log_path).read_text())
        assert pauses and set(pauses) == {"1.00 second"}, pauses


async def _redis_away(stack: Stack, round_: int) -> None:
    conversation = stack.conversations[2 + round_]
    requests = {f"r{round_}-{i}": PROMPTS[i] for i in range(2)}
    async with stack.with_session(f"/ws/chat/{conversation}") as chat, stack.api() as api:
        # Long enough that no machine finishes it between its first delta and Redis going away.
        await chat_send(chat, "Tell me about dicts", 400)
        assert json.loads(await chat.recv())["type"] == "started"
        for rid, prompt in requests.items():
            await api.send(generate(rid, prompt))
        first = json.loads(await asyncio.wait_for(chat.recv(), 30))
        assert first["type"] == "delta", first
        await asyncio.to_thread(stack.redis_server.stop)
        stopped_at = time.monotonic()
        try:
            text, done = await chat_until_done(chat, timeout=ERROR_WITHIN_S)
            assert done["finish_reason"] == "error", done
            assert stack.stored_replies(conversation) == [(first["text"] + text, "error", done["error"])]
            got = await answers(api, requests, timeout=ERROR_WITHIN_S)
            assert all(a.ended_at - stopped_at < ERROR_WITHIN_S for a in got.values()), "a client waited too long"
            assert_solo(stack, requests, got, may_fail=set(requests), code="worker_lost")
            await api.send(generate(f"r{round_}-during", PROMPTS[2]))  # sent while Redis is away
            during = (await answers(api, [f"r{round_}-during"], timeout=ERROR_WITHIN_S))[f"r{round_}-during"]
            assert during.error in ("unavailable", "worker_lost"), during.end
        finally:
            await asyncio.to_thread(stack.redis_server.start)


# -- 3. a forward that raises for one row -------------------------------------------------------

def test_a_forward_that_raises_for_one_row_twice(stack):
    for round_ in range(2):
        asyncio.run(_poisoned_row(stack, round_))
        stack.nothing_twice()
        serves_again(stack, f"poison{round_}")


async def _poisoned_row(stack: Stack, round_: int) -> None:
    conversation = stack.conversations[4 + round_]
    requests = {f"p{round_}-{i}": PROMPTS[i] for i in range(4)}
    poison = f"p{round_}-poison"
    async with stack.with_session(f"/ws/chat/{conversation}") as chat, stack.api() as api:
        for rid, prompt in requests.items():
            await api.send(generate(rid, prompt))
        await async_wait_until(lambda: all(stack.holder(rid) for rid in requests), 15, "a worker to hold every request")
        await api.send(generate(poison, f"Here is a {POISON} for you"))  # while the others decode
        await chat_send(chat, f"and a {POISON} in a chat", 16)
        got = await answers(api, [*requests, poison])
        assert got[poison].error == "engine_error" and "injected" in got[poison].end["message"], got[poison].end
        assert_solo(stack, requests, got)  # not one of the rows batched with it is lost
        _, done = await chat_until_done(chat)
        assert done["finish_reason"] == "error" and "injected" in done["error"]
        assert stack.stored_replies(conversation) == [("", "error", done["error"])]
    admitted = stack.cluster.admissions()
    poisoned_worker = next(w for rid, [w] in admitted.items() if f"-{poison}." in rid)
    assert any(f"-{rid}." in engine_id and w == [poisoned_worker] for engine_id, w in admitted.items()
               for rid in requests), "liveness: the poisoned row's worker served some of the others meanwhile"


# -- 4. the device loop's kill switch flipped mid-burst ------------------------------------------

def test_the_kill_switch_flipped_mid_burst_twice(stack):
    for round_ in range(2):
        asyncio.run(_kill_switch(stack, round_))
        bursts_rearmed = stack.metric("device_loop_bursts")
        serves_again(stack, f"switch{round_}")
        asyncio.run(async_wait_until(lambda: stack.metric("device_loop_bursts") > bursts_rearmed, 5,
                                     "re-armed, the loop bursts again"))  # (the heartbeat shows it within a beat)
        stack.nothing_twice()


async def _set_flag(dashboard, value: bool) -> dict:
    await dashboard.send(json.dumps({"type": "set_flag", "id": value, "name": "ARC_DEVICE_LOOP_KILLED", "value": value}))
    while True:
        frame = json.loads(await asyncio.wait_for(dashboard.recv(), 20))
        if frame["type"] in ("flag_result", "error") and frame.get("id") == value:
            return frame


async def _kill_switch(stack: Stack, round_: int) -> None:
    requests = {f"s{round_}-{i}": PROMPTS[i] for i in range(4)}
    bursts_before = stack.metric("device_loop_bursts")
    async with stack.with_session("/ws/ops/dashboard") as dashboard, stack.api() as api:
        for rid, prompt in requests.items():
            await api.send(generate(rid, prompt))
        await async_wait_until(lambda: stack.metric("device_loop_bursts") > bursts_before, 15,
                               "liveness: the device loop bursts (tokens are parked) before the switch")
        killed = await _set_flag(dashboard, True)
        assert killed["type"] == "flag_result" and len(killed["answers"]) == 2, killed
        assert all(a["in_force"]["ARC_DEVICE_LOOP_KILLED"] for a in killed["answers"].values()), killed
        # Re-armed at once, while the requests still run: the loop comes back over rows that host decode
        # moved on (their parked tokens from before the switch are stale by then).
        rearmed = await _set_flag(dashboard, False)
        assert all(not a["in_force"]["ARC_DEVICE_LOOP_KILLED"] for a in rearmed["answers"].values()), rearmed
        got = await answers(api, requests)
        assert_solo(stack, requests, got)  # host decode took over, and back, without a token lost, doubled or mixed


# -- 5. a KV pool small enough for a preemption storm --------------------------------------------

def test_a_preemption_storm_twice(stack):
    for round_ in range(2):
        preempted = stack.metric("preemptions")
        requests = {f"storm{round_}-{i}": prompt for i, prompt in enumerate(PROMPTS[:8])}
        assert_solo(stack, requests, asyncio.run(ask(stack, requests, timeout=120)))
        asyncio.run(async_wait_until(lambda: stack.metric("preemptions") > preempted, 5,
                                     f"liveness: with {KV_BLOCKS} blocks a worker, they preempt"))
        stack.nothing_twice()


# -- 6. a client that stops reading --------------------------------------------------------------

def test_a_client_that_stops_reading_twice(stack):
    for round_ in range(2):
        asyncio.run(_slow_consumer(stack, round_))
        stack.nothing_twice()


async def _slow_consumer(stack: Stack, round_: int) -> None:
    host, port = stack.address.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # the kernel's buffer fills at once
    sock.connect((host, int(port)))
    slow_id, requests = f"slow{round_}", {f"f{round_}-{i}": PROMPTS[i] for i in range(1, 4)}
    # max_queue=1: the client library stops reading the socket as soon as one frame waits unread.
    async with stack.api(sock=sock, max_queue=1) as slow, stack.api() as fast:
        # Top-20 logprobs make each delta frame ~1 KB: the reply outgrows every buffer on the way.
        await slow.send(generate(slow_id, PROMPTS[0], logprobs=20))
        await async_wait_until(lambda: any(f"-{slow_id}." in rid for rid in stack.cluster.admissions()), 15,
                               "liveness: the slow one runs")
        for rid, prompt in requests.items():
            await fast.send(generate(rid, prompt))
        assert_solo(stack, requests, await answers(fast, requests))  # unaffected by the one not reading
        # Bounded: its worker is done with it while nobody reads; it holds no engine slot.
        await async_wait_until(lambda: stack.holder(slow_id) is None, 30,
                               "its worker to let go of the reply nobody reads")
        got = await answers(slow, [slow_id])
        assert_solo(stack, {slow_id: PROMPTS[0]}, got)  # reading at last, it gets all of it, in order
