"""A chaos soak: bench/load.py's client mix over the Celery stack, plus chat clients, while a worker is
SIGKILLed and Redis is restarted at set times; every answer is judged.

    .venv/bin/python bench/chaos_soak.py [--seconds 600] [--clients 16] [--chat-clients 4] [--users 8]
        [--max-tokens 24] [--kill-at 0.3] [--redis-at 0.6] [--redis-down-s 2] [--seed 0]

The stack is bench/load_stack.py's (a private redis-server, two Celery workers, one Daphne, loopback
only, the device loop and graphs on). The API clients run bench/load_clients.py's requests round and
round (websocket and OpenAI, ~30% canceled, ~10% dropped); each chat client holds one conversation and
sends turn after turn on the chat socket, as the page does. At --kill-at of the run one worker is
SIGKILLed and a fresh one started; at --redis-at Redis is stopped for --redis-down-s and started again,
empty, on its port.

The verdict (exit 1 if any fails):
- every answer is done, canceled or dropped by its client, or a structured error; none unanswered (no
  frame within load_clients.RECEIVE_S, or no connection);
- no mismatch (bench/load_oracle.py): a done answer equals its solo run, a canceled, dropped or errored
  one is a prefix of it;
- no `unavailable` and no `worker_lost` outside the fault windows (from each fault until FAULT_WINDOW_S
  after it ended): a live worker taken for lost, or none seen, while nothing was broken;
- every chat turn the client saw end (`done`) is stored: its message, its text and its finish reason.
RSS, fds, KV blocks and Redis keys are sampled before the load and once the stack is idle again
(bench/soak.py), printed, not judged: the killed worker's replacement is a new process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from bench import load_oracle, soak  # noqa: E402
from bench.load_clients import BASES, RECEIVE_S, Result, run_one, specs  # noqa: E402
from bench.load_stack import Target, start  # noqa: E402

FAULT_WINDOW_S = 15.0  # after a fault ends, how long the stack may still answer `unavailable`


@dataclass
class Turn:
    """One chat turn as its client saw it."""
    conversation: int
    ending: str = "unanswered"  # done / error:<code> / unanswered:<exception>
    text: str = ""
    finish_reason: str | None = None
    message_id: int | None = None
    ended_at: float = 0.0


@dataclass
class Faults:
    """When each fault began and ended, in s since the load started."""
    windows: list[tuple[str, float, float]] = field(default_factory=list)

    def covers(self, at: float) -> bool:
        return any(begin <= at <= end + FAULT_WINDOW_S for _, begin, end in self.windows)


async def chat_client(address: str, session: str, conversation: int, rng: random.Random, max_tokens: int,
                      deadline: float, began: float, turns: list[Turn]) -> None:
    headers = {"Cookie": f"sessionid={session}"}
    while time.monotonic() < deadline:
        turn = Turn(conversation)
        turns.append(turn)
        prompt = f"{rng.choice(BASES)} (turn {len(turns)})"
        params = {"max_tokens": rng.randint(4, max_tokens), "temperature": 0, "ignore_eos": True}
        try:
            async with websockets.connect(f"ws://{address}/ws/chat/{conversation}", additional_headers=headers,
                                          open_timeout=RECEIVE_S) as ws:
                await ws.send(json.dumps({"type": "send", "content": prompt, "params": params}))
                while turn.ending == "unanswered":
                    frame = json.loads(await asyncio.wait_for(ws.recv(), RECEIVE_S))
                    if frame["type"] == "delta":
                        turn.text += frame["text"]
                    elif frame["type"] == "done":
                        turn.ending, turn.finish_reason, turn.message_id = "done", frame["finish_reason"], frame["message_id"]
                    elif frame["type"] == "error":
                        turn.ending = f"error:{frame['code']}"
        except Exception as exc:  # no answer: counted, and the client goes on
            turn.ending = f"unanswered:{type(exc).__name__}"
            await asyncio.sleep(1)
        turn.ended_at = time.monotonic() - began
        if turn.ending.startswith("error"):
            await asyncio.sleep(0.5)  # a refusal (Redis away): try again shortly, as a person would


async def api_client(target: Target, mine: list, deadline: float, began: float,
                     results: list[tuple[float, Result]]) -> None:
    k = 0
    while time.monotonic() < deadline:
        result = await run_one(target.address, target.tokens, mine[k % len(mine)])
        results.append((time.monotonic() - began, result))
        k += 1


async def inject(target: Target, args: argparse.Namespace, began: float, faults: Faults) -> None:
    cluster, redis_server = target.cluster, target.redis_server
    await asyncio.sleep(max(0.0, began + args.kill_at * args.seconds - time.monotonic()))
    at = time.monotonic() - began
    victim = next(p for p in cluster.workers if p.poll() is None)
    await asyncio.to_thread(cluster.kill, victim)
    print(f"chaos: SIGKILLed worker {cluster.worker_id(victim)} at {at:.1f} s", flush=True)
    await asyncio.to_thread(cluster.start_workers, 1)
    faults.windows.append(("worker SIGKILLed, a fresh one started", at, time.monotonic() - began))
    print(f"chaos: the fresh worker is up at {faults.windows[-1][2]:.1f} s", flush=True)
    await asyncio.sleep(max(0.0, began + args.redis_at * args.seconds - time.monotonic()))
    at = time.monotonic() - began
    await asyncio.to_thread(redis_server.stop)
    await asyncio.sleep(args.redis_down_s)
    await asyncio.to_thread(redis_server.start)
    faults.windows.append(("Redis stopped and started empty", at, time.monotonic() - began))
    print(f"chaos: Redis down from {at:.1f} s to {faults.windows[-1][2]:.1f} s", flush=True)


async def run(target: Target, args: argparse.Namespace, plans: list, chats: list[tuple[str, int]]) -> tuple:
    began = time.monotonic()
    deadline = began + args.seconds
    results: list[tuple[float, Result]] = []
    turns: list[Turn] = []
    faults = Faults()
    rng = random.Random(args.seed)
    mixes = [[s for plan in plans for s in plan[n]] for n in range(args.clients)]
    tasks = [asyncio.create_task(api_client(target, mine, deadline, began, results)) for mine in mixes]
    tasks += [asyncio.create_task(chat_client(target.address, session, conversation, random.Random(rng.random()),
                                              args.max_tokens, deadline, began, turns))
              for session, conversation in chats]
    await asyncio.gather(inject(target, args, began, faults), *tasks)
    return results, turns, faults


def stored(db_path: Path, turns: list[Turn]) -> list[dict]:
    """The chat turns seen done whose stored message is missing or differs."""
    db = sqlite3.connect(db_path)
    try:
        rows = {pk: (conversation, content, finish_reason) for pk, conversation, content, finish_reason in db.execute(
            "SELECT id, conversation_id, content, finish_reason FROM chat_message WHERE role = 'assistant'")}
    finally:
        db.close()
    return [asdict(t) for t in turns if t.ending == "done"
            and rows.get(t.message_id) != (t.conversation, t.text, t.finish_reason)]


def cut_mismatches(results: list[Result], answers: dict[int, load_oracle.Solo]) -> list[int]:
    """Errored answers (the judge skips them) must still be a prefix of their solo run."""
    wrong = []
    for r in results:
        if r.ending.startswith("error"):
            want = answers[r.spec.number]
            got, expected = (r.token_ids, want.token_ids) if r.spec.api == "ws" else (r.text, want.text)
            if expected[:len(got)] != got:
                wrong.append(r.spec.number)
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--clients", type=int, default=16, help="API clients (websocket and OpenAI, alternating)")
    parser.add_argument("--chat-clients", type=int, default=4)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--kill-at", type=float, default=0.3, help="share of the run at which a worker is SIGKILLed")
    parser.add_argument("--redis-at", type=float, default=0.6, help="share of the run at which Redis is restarted")
    parser.add_argument("--redis-down-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from tests.cluster import operator_session

    users = [f"load{i}" for i in range(args.users)]
    plans = [specs(args.clients, 2, users, args.seed + k, args.max_tokens, k * args.clients * 2) for k in range(2)]
    with tempfile.TemporaryDirectory() as workdir:
        target = start("celery", Path(workdir), users, device_loop=True, graphs=True, workers=2)
        db_path = target.db_path
        assert db_path is not None  # start() made it
        try:
            chats = []
            for n in range(args.chat_clients):
                session, [conversation] = operator_session(target.cluster.env, db_path, 1, f"chat{n}")
                chats.append((session, conversation))
            before = soak.sample(target, 0.0, True)
            load_average = [os.getloadavg()[0]]
            results, turns, faults = asyncio.run(run(target, args, plans, chats))
            idle = asyncio.run(soak.quiesce(target, timeout=60))
            after = soak.sample(target, args.seconds, idle)
            load_average.append(os.getloadavg()[0])
            missing = stored(db_path, turns)
        finally:
            target.stop()
    served = [r for _, r in results]
    answers = load_oracle.solo([s for plan in plans for mine in plan for s in mine])
    report = load_oracle.judge(served, answers)
    errors_at: dict[str, list[float]] = {}  # each error's code -> when its answer ended (s since the load began)
    for at, ending in [(at, r.ending) for at, r in results] + [(t.ended_at, t.ending) for t in turns]:
        if ending.startswith("error"):
            errors_at.setdefault(ending, []).append(round(at, 1))
    for chat in turns:  # a chat reply cut by a fault ends `done` with finish_reason error, stored as such
        if chat.finish_reason == "error":
            errors_at.setdefault("chat done:error", []).append(round(chat.ended_at, 1))
    false_alarms = {code: [at for at in times if not faults.covers(at)] for code, times in errors_at.items()
                    if code in ("error:unavailable", "error:worker_lost")}
    false_alarm_times = [at for times in false_alarms.values() for at in times]
    chat_endings: dict[str, int] = {}
    for t in turns:
        key = t.ending if t.ending != "done" else f"done:{t.finish_reason}"
        chat_endings[key] = chat_endings.get(key, 0) + 1
    report.update(seconds=args.seconds, faults=faults.windows, cut_mismatches=cut_mismatches(served, answers),
                  errors_at={code: sorted(times) for code, times in errors_at.items()},
                  false_unavailable_or_lost=false_alarms, chat_turns=len(turns), chat_endings=chat_endings,
                  chat_done_not_stored=missing, load_average_start_end=load_average, before=asdict(before),
                  after=asdict(after))
    unanswered = report["unanswered"] + sum(t.ending.startswith("unanswered") for t in turns)
    report["unanswered_all"] = unanswered
    print(json.dumps(report, indent=1))
    failed = (report["mismatches"] or report["cut_mismatches"] or report["offset_gaps"] or unanswered
              or false_alarm_times or missing or len(faults.windows) < 2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
