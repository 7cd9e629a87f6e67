"""Serving benchmark: the websocket API under 1, 8 and 32 concurrent clients, beside the engine alone.

    .venv/bin/python bench/serving.py [--clients 1,8,32] [--requests-per-client 4] [--max-tokens 64]
                                      [--transports inprocess,celery] [--rounds 1] [--streams default]
                                      [--device cpu]

In the style of vLLM's benchmark_serving: each client sends its requests one after another; per request
we record time to first token (TTFT), how much of it passed outside the engine's process (the client's
TTFT minus the engine's own, from the done frame) and how much queued in it before its first step (the
step in flight when it came included), time per output token after the first (TPOT), inter-token
latencies (ITL, a delta's gap divided over its tokens) and end-to-end latency; per run, delivered
output tokens/s. "engine" runs the same requests at the same concurrency straight on an in-process
Engine (no web, no websocket, no JSON); "inprocess" through a real Daphne with the engine on its
thread; "celery" through a real Daphne and one real Celery worker (one engine, as in the others) over
the machine's Redis (REDIS_URL). The demo model, greedy, EOS ignored, so all produce the same tokens.
With --streams default,1,4,20ms each transport also runs with every step's tokens sent as they come
(WORKBENCH_STREAM_INTERVAL=1, WORKBENCH_STREAM_GAP_MS=0), with 4-token deltas (interval 4) and with
deltas at least 20 ms apart (gap 20), beside the server's defaults, as "inprocess:1", "inprocess:4",
"inprocess:20ms" and the same for celery (celery:X is compared with inprocess:X).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from statistics import median
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from tests.cluster import Cluster, start_daphne  # noqa: E402

PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
           "If the file does not exist,", "The default value is", "Raise an exception when", "Each thread has"]


@dataclass
class RequestRecord:
    sent: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0
    itls: list[float] = field(default_factory=list)
    engine_ttft: float | None = None  # the engine's own time to first token, from the done frame
    engine_queue: float | None = None  # of which waiting to be scheduled, the step in flight included


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))] if values else float("nan")


def summarize(records: list[RequestRecord], wall: float) -> dict:
    ttft = [r.first - r.sent for r in records]
    tpot = [(r.done - r.first) / (r.tokens - 1) for r in records if r.tokens > 1]
    itl = [x for r in records for x in r.itls]
    e2e = [r.done - r.sent for r in records]
    outside = [r.first - r.sent - r.engine_ttft for r in records if r.engine_ttft is not None]
    queue = [r.engine_queue for r in records if r.engine_queue is not None]
    return {"tok_s": sum(r.tokens for r in records) / wall, "ttft50": percentile(ttft, 50),
            "outside50": percentile(outside, 50), "queue50": percentile(queue, 50),
            "ttft99": percentile(ttft, 99), "tpot50": percentile(tpot, 50), "itl50": percentile(itl, 50),
            "itl99": percentile(itl, 99), "e2e50": percentile(e2e, 50), "e2e99": percentile(e2e, 99)}


def engine_only(clients: int, total: int, params: SamplingParams, device: str) -> dict:
    engine = Engine(EngineConfig.from_env(model="demo", device=device))
    engine.generate(PROMPTS[:2], params)  # warm-up
    queue = [PROMPTS[i % len(PROMPTS)] for i in range(total)]
    records: dict[str, RequestRecord] = {}
    last_seen: dict[str, float] = {}
    start, added = time.perf_counter(), 0
    while added < total or engine.has_unfinished_requests():
        while added < total and sum(1 for r in records.values() if r.done is None) < clients:
            rid = f"r{added}"
            records[rid] = RequestRecord(sent=time.perf_counter())
            engine.add_request(rid, queue[added], params)
            added += 1
        for out in engine.step():
            now, record = time.perf_counter(), records[out.request_id]
            if out.token_ids:
                if record.first is None:
                    record.first = now
                else:
                    record.itls += [(now - last_seen[out.request_id]) / len(out.token_ids)] * len(out.token_ids)
                last_seen[out.request_id] = now
                record.tokens += len(out.token_ids)
            if out.finished:
                record.done = now
                record.engine_queue = (out.timings or {}).get("queue_time")
    return summarize(list(records.values()), time.perf_counter() - start)


async def websocket_run(address: str, token: str, clients: int, per_client: int, params: dict) -> dict:
    records: list[RequestRecord] = []

    async def client(index: int) -> None:
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            for n in range(per_client):
                record = RequestRecord(sent=time.perf_counter())
                records.append(record)
                prompt = PROMPTS[(index * per_client + n) % len(PROMPTS)]
                await ws.send(json.dumps({"type": "generate", "request_id": str(n), "prompt": prompt, "params": params}))
                last = None
                while True:
                    frame = json.loads(await ws.recv())
                    now = time.perf_counter()
                    if frame["type"] == "delta":
                        count = len(frame["token_ids"])
                        if record.first is None:
                            record.first = now
                        else:
                            record.itls += [(now - last) / count] * count
                        last = now
                        record.tokens += count
                    elif frame["type"] in ("done", "error"):
                        record.done = now
                        timings = frame.get("timings") or {}
                        record.engine_ttft = timings.get("time_to_first_token")
                        record.engine_queue = timings.get("queue_time")
                        break

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return summarize(records, time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_processes(started) -> dict[str, int]:
    if isinstance(started, Cluster):
        return {"daphne": started.daphne.pid, "worker": started.workers[0].pid}
    return {"daphne": started[0].pid}


def stream_env(spec: str) -> dict[str, str]:
    """The stream settings a --streams entry names: "default" (the server's own, or the shell's),
    "N" (N-token deltas, no gap) or "Gms" (deltas at least G ms apart, interval 1)."""
    if spec == "default":
        return {}
    if re.fullmatch(r"[0-9]+", spec):
        return {"WORKBENCH_STREAM_INTERVAL": spec, "WORKBENCH_STREAM_GAP_MS": "0"}
    if re.fullmatch(r"[0-9]+ms", spec):
        return {"WORKBENCH_STREAM_INTERVAL": "1", "WORKBENCH_STREAM_GAP_MS": spec[:-2]}
    raise SystemExit(f"--streams: {spec!r} is not default, a number of tokens or a number of ms (20ms)")


def start_inprocess(workdir: Path, spec: str, device: str) -> tuple[list[subprocess.Popen], str, str]:
    server, address, token = start_daphne({**os.environ, **stream_env(spec), "WORKBENCH_TRANSPORT": "inprocess",
                                           "WORKBENCH_DEVICE": device},
                                          workdir / f"inprocess-{spec}.sqlite3")
    return [server], address, token


def start_celery(workdir: Path, spec: str, device: str) -> tuple[Cluster, str, str]:
    cluster = Cluster(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), workdir, **stream_env(spec),
                      WORKBENCH_DEVICE=device)
    cluster.start_workers(1)
    address, token = cluster.start_daphne(workdir / f"celery-{spec}.sqlite3")
    return cluster, address, token


def label(transport: str, spec: str) -> str:
    return transport if spec == "default" else f"{transport}:{spec}"


def inprocess_peer(mode: str, servers: dict) -> str | None:
    """The in-process mode a Celery mode is compared with: the one at the same stream settings."""
    if not mode.startswith("celery"):
        return None
    peer = mode.replace("celery", "inprocess", 1)
    return peer if peer in servers else None


def one_round(clients: int, per_client: int, params: dict, servers: dict, device: str) -> dict:
    """Each transport at one concurrency, bracketed by engine-only runs (engine, inprocess, engine,
    celery, engine, ...): a transport is compared with the mean of the engine-only runs just before
    and just after it, because this shared machine's speed drifts by up to 2x within a minute, and a
    reference measured further away would measure the drift. Rows in the order they ran; each
    transport's row with its server processes' CPU."""
    def run_engine() -> dict:
        return engine_only(clients, clients * per_client, SamplingParams(**params), device)

    rows, results = [("engine", run_engine())], {}
    for transport, (started, address, token) in servers.items():
        before_engine = rows[-1][1]
        processes = _server_processes(started)
        before, t0 = {name: cpu_seconds(pid) for name, pid in processes.items()}, time.perf_counter()
        row = asyncio.run(websocket_run(address, token, clients, per_client, params))
        wall = time.perf_counter() - t0
        row["cpu"] = ", ".join(f"{name} {(cpu_seconds(pid) - before[name]) / wall:.0%}"
                               for name, pid in processes.items())
        after_engine = run_engine()
        rows += [(transport, row), ("engine", after_engine)]
        row["engine_tok_s"] = (before_engine["tok_s"] + after_engine["tok_s"]) / 2
        row["engine_ttft50"] = (before_engine["ttft50"] + after_engine["ttft50"]) / 2
        row["engine_queue50"] = (before_engine["queue50"] + after_engine["queue50"]) / 2
        row["of_engine"] = row["tok_s"] / row["engine_tok_s"]
        row["ttft_over"] = row["ttft50"] - row["engine_ttft50"]
        results[transport] = row
    for transport, row in results.items():
        peer = inprocess_peer(transport, servers)
        # Each against its own engine-only bracket, so the drift between the two runs cancels.
        row["of_peer"] = row["of_engine"] / results[peer]["of_engine"] if peer else None
    return {"rows": rows, "results": results}


def print_round(clients: int, measured: dict, servers: dict) -> None:
    for mode, r in measured["rows"]:
        ms = {k: r[k] * 1000 for k in ("ttft50", "ttft99", "tpot50", "itl50", "itl99", "e2e50", "e2e99")}
        print(f"{clients:>7} {mode:>12} {r['tok_s']:>8.1f} {ms['ttft50']:>9.1f} {ms['ttft99']:>7.1f} "
              f"{ms['tpot50']:>9.2f} {ms['itl50']:>8.2f} {ms['itl99']:>7.2f} {ms['e2e50']:>8.1f} "
              f"{ms['e2e99']:>7.1f}", flush=True)
    for transport, w in measured["results"].items():
        peer = inprocess_peer(transport, servers)
        print(f"{clients:>7} {'ratio':>12} {transport}: delivered {w['of_engine']:.0%} of engine-only "
              f"({w['engine_tok_s']:.1f} tok/s, the runs either side)"
              + (f", {w['of_peer']:.0%} of {peer}" if peer else "")
              + f", TTFT p50 +{w['ttft_over'] * 1000:.1f} ms"
              + f" ({w['outside50'] * 1000:.1f} ms of each TTFT outside the engine's process, and"
              + f" {w['queue50'] * 1000:.1f} ms queued in it, p50; engine-only queued"
              + f" {w['engine_queue50'] * 1000:.1f} ms)"
              + f"; server CPU {w['cpu']}", flush=True)


def print_medians(clients: int, rounds: list[dict], servers: dict) -> None:
    """Each transport's median share over the rounds, with every round's share beside it."""
    for transport in servers:
        results = [r["results"][transport] for r in rounds]
        of_engine, ttft = [r["of_engine"] for r in results], [r["ttft_over"] for r in results]
        line = (f"{clients:>7} {'median':>12} {transport} over {len(rounds)} rounds: delivered {median(of_engine):.0%} "
                f"of engine-only ({', '.join(f'{x:.0%}' for x in of_engine)})")
        peer = inprocess_peer(transport, servers)
        if peer:
            of_peer = [r["of_peer"] for r in results]
            line += f", {median(of_peer):.0%} of {peer} ({', '.join(f'{x:.0%}' for x in of_peer)})"
        line += f", TTFT p50 +{median(ttft) * 1000:.1f} ms ({', '.join(f'+{x * 1000:.1f}' for x in ttft)})"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--transports", default="inprocess,celery")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat each concurrency this many times, alternating the modes, and print the "
                             "median share: one run on a shared machine moves by 10 points")
    parser.add_argument("--streams", default="default",
                        help="stream settings to run each transport at, side by side: default, N (tokens "
                             "per delta) or Gms (least time between deltas)")
    parser.add_argument("--device", default="cpu", help="where every engine runs (cpu, cuda)")
    args = parser.parse_args()
    # The servers it starts run with DEBUG off, which refuses the development key: they are throwaway,
    # so one key made for this run (workbench/secret_key.py) unless the shell gives one.
    os.environ.setdefault("WORKBENCH_SECRET_KEY", secrets.token_urlsafe(50))
    params = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    workdir = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    servers = {}
    try:
        for spec in args.streams.split(","):
            stream_env(spec)  # a bad entry stops the run before any server starts
        for spec in args.streams.split(","):
            for transport in args.transports.split(","):
                start = start_celery if transport == "celery" else start_inprocess
                started = servers[label(transport, spec)] = start(workdir, spec, args.device)
                asyncio.run(websocket_run(started[1], started[2], 1, 1, params))  # warm-up: the engine loads
        print(f"{'clients':>7} {'mode':>12} {'tok/s':>8} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} "
              f"{'ITL p50':>8} {'p99':>7} {'E2E p50':>8} {'p99':>7}  (ms)")
        for clients in [int(c) for c in args.clients.split(",")]:
            rounds = []
            for _ in range(args.rounds):
                rows = one_round(clients, args.requests_per_client, params, servers, args.device)
                print_round(clients, rows, servers)
                rounds.append(rows)
            if args.rounds > 1:
                print_medians(clients, rounds, servers)
    finally:
        for started in servers.values():
            if isinstance(started[0], Cluster):
                started[0].stop()
            else:
                for process in started[0]:
                    process.terminate()
                    process.wait(timeout=10)


if __name__ == "__main__":
    main()
