"""Load with a leak oracle: N concurrent clients over the websocket API and the OpenAI API, each answer
compared with the same request run alone; and, with --soak, a soak that checks nothing grows.

    .venv/bin/python bench/load.py [--transport inprocess|celery] [--workers 2] [--clients 64]
        [--model demo] [--requests-per-client 2] [--users 16] [--seed 0] [--max-tokens 48] [--greedy-share 0.5]
        [--device-loop/--no-device-loop] [--graphs/--no-graphs] [--near-tie-eps 0.001]
        [--soak SECONDS [--interval SECONDS]] [--address HOST:PORT --tokens FILE [--session COOKIE]]

Without --address it starts a real stack on loopback (bench/load_stack.py, through tests/cluster.py):
in-process, one Daphne with the engine on a thread; celery, a private redis-server, --workers Celery GPU
workers and one Daphne. A fresh database, tokens for --users users, the per-user limits off, the device
loop and graphs on unless turned off (their ARC_* variables). It reads every engine's flags in force,
device-loop bursts and graph replays from the dashboard socket before and after the run, prints them,
and fails the run if an asked-for flag was not in force or never acted.

Each request has a distinct prompt, greedy or seeded sampling, sometimes a stop string, and a max_tokens
from 4 to --max-tokens; about 30% are canceled mid-stream, 10% drop their connection abruptly, 5% read
slowly (bench/load_clients.py). The oracle (bench/load_oracle.py): a completed answer must equal its solo
run, a canceled or dropped one must be a prefix of it, except where a greedy answer first differs at a
near-tie the solo run logged (counted apart as forgiven); every websocket delta's index must continue
where the last ended. Prints requests, tokens, endings and errors by code, mismatches, forgiven
near-ties, offset gaps, TTFT and ITL percentiles; exits 1 on any mismatch, gap or unanswered request.

--soak SECONDS runs the clients round and round over two plans for that long instead, pausing every
--interval seconds (default: a tenth of the soak) to sample the idle stack (bench/soak.py); it prints
the samples and a verdict per measure and exits 1 if any did not stay flat. Bounded: every receive has
a 60 s limit, every wait for an idle stack 30 s; loopback only. tests/workbench/test_load.py runs it small.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import load_oracle, soak  # noqa: E402
from bench.load_clients import Spec, load, specs  # noqa: E402
from bench.load_clients import soak as soak_load  # noqa: E402
from bench.load_stack import Target, engines, engines_after, runtime_check, start  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.engine_config import EngineConfig  # noqa: E402

SOAK_PLANS = 2  # a soak repeats this many plans: the oracle's solo runs stay 2 x clients


def run_load(target: Target, plan: list[list[Spec]]) -> tuple[list, float]:
    started = time.monotonic()
    results = asyncio.run(load(target.address, target.tokens, plan, target.model))
    return results, time.monotonic() - started


def run_soak(target: Target, plans: list[list[list[Spec]]], seconds: float, interval: float) -> tuple[list, list]:
    points: list[soak.Checkpoint] = []
    began = time.monotonic()

    async def checkpoint() -> None:
        idle = await soak.quiesce(target)
        points.append(await asyncio.to_thread(soak.sample, target, time.monotonic() - began, idle))
        print(f"soak: checkpoint at {points[-1].at_s} s: {json.dumps(asdict(points[-1]))}", flush=True)

    async def run() -> list:
        await checkpoint()
        return await soak_load(target.address, target.tokens, plans, seconds, interval, checkpoint, target.model)

    return asyncio.run(run()), points


def engine_alone(model: str) -> Engine:
    """The oracle's reference: `model` as the stack's engine is configured from this environment
    (workbench/serving/engine_settings.py: WORKBENCH_DEVICE, WORKBENCH_DTYPE and WORKBENCH_WEIGHTS, read as
    workbench/settings.py reads them, stripped and empty as unset), device loop and graphs off. With
    --address the server's own environment is not known: this one stands for it."""
    def setting(name: str) -> str | None:
        return os.environ.get(name, "").strip() or None
    return Engine(EngineConfig(model=model, device=setting("WORKBENCH_DEVICE") or "cpu",
                               dtype=setting("WORKBENCH_DTYPE") or "float32", weights=setting("WORKBENCH_WEIGHTS")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("inprocess", "celery"), default="inprocess")
    parser.add_argument("--workers", type=int, default=2, help="Celery GPU workers (--transport celery)")
    parser.add_argument("--model", default="demo", help="the model served and run alone (smollm2 as `make run` "
                        "serves it: WORKBENCH_WEIGHTS=quantized WORKBENCH_DTYPE=bfloat16 in the environment)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=48, help="each request's max_tokens is 4 to this")
    parser.add_argument("--greedy-share", type=float, default=0.5, help="share of greedy requests (the rest seeded)")
    parser.add_argument("--device-loop", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--near-tie-eps", type=float, default=load_oracle.NEAR_TIE_EPS,
                        help="a greedy answer's first differing token is forgiven within this logprob gap (nats)")
    parser.add_argument("--soak", type=float, metavar="SECONDS", help="soak for this long and judge flatness")
    parser.add_argument("--interval", type=float, help="seconds between the soak's checkpoints (default: soak/10)")
    parser.add_argument("--address", help="a running server (loopback); needs --tokens")
    parser.add_argument("--tokens", help="a JSON file {username: token} for --address")
    parser.add_argument("--session", help="a staff session cookie for --address: the flags are read with it")
    args = parser.parse_args(argv)
    if args.address and args.soak:
        parser.error("--soak samples the processes of a stack it started: leave out --address")
    users = [f"load{i}" for i in range(args.users)]
    with tempfile.TemporaryDirectory() as workdir:
        if args.address:
            tokens = json.loads(Path(args.tokens).read_text())
            target, users = Target("given", args.address, tokens, args.session, model=args.model), sorted(tokens)
        else:
            target = start(args.transport, Path(workdir), users, args.device_loop, args.graphs, args.workers,
                           args.model)
        try:
            before = asyncio.run(engines(target)) if target.session else {}
            if args.soak:
                plans = [specs(args.clients, args.requests_per_client, users, args.seed + k, args.max_tokens,
                               k * args.clients * args.requests_per_client, args.greedy_share) for k in range(SOAK_PLANS)]
                started = time.monotonic()
                results, points = run_soak(target, plans, args.soak, args.interval or max(5.0, args.soak / 10))
                wall = time.monotonic() - started
            else:
                plans = [specs(args.clients, args.requests_per_client, users, args.seed, args.max_tokens,
                               greedy_share=args.greedy_share)]
                results, wall = run_load(target, plans[0])
            after = asyncio.run(engines_after(target, before)) if target.session else {}
            audit = audit_counts(target.address)
        finally:
            target.stop()
    report = load_oracle.judge(results, load_oracle.solo([s for plan in plans for mine in plan for s in mine],
                                                         args.near_tie_eps, engine_alone(args.model)))
    report.update(transport=target.transport, near_tie_eps=args.near_tie_eps, wall_s=round(wall, 1),
                  tokens_per_s=round(report["tokens"] / wall, 1), replay_audit=audit)
    failed = bool(report["mismatches"] or report["offset_gaps"] or report["unanswered"]
                  or audit.get("mismatched"))
    if target.session:
        lines, runtime_ok = runtime_check(before, after, args.device_loop, args.graphs)
        report["runtime"] = lines
        failed |= not runtime_ok
    else:
        report["runtime"] = ["not read (no --session): the flags in force are unknown"]
    if args.soak:
        report["soak"] = soak.verdict(points)
        report["soak_flat"] = all(row["flat"] for row in report["soak"])
        failed |= not report["soak_flat"]
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


def audit_counts(address: str, settle_s: float = 10.0, timeout_s: float = 600.0) -> dict[str, float]:
    """The replay audit's counts on /metrics (summed over workers) once they stop moving: the audit
    re-runs its queue while the stack is idle, after the load (docs/OPERATIONS.md, "The replay audit").
    ARC_REPLAY_AUDIT_PERMILLE chooses the share at the stack's start."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name.startswith("workbench_replay_audit"):
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        key = sample.name.removeprefix("workbench_replay_").removesuffix("_total")
                        counts[key] = counts.get(key, 0) + sample.value
        return counts

    deadline, last, still_since = time.monotonic() + timeout_s, scrape(), time.monotonic()
    while os.environ.get("ARC_REPLAY_AUDIT_PERMILLE") != "0" and time.monotonic() < deadline:
        time.sleep(0.5)
        now = scrape()
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= settle_s:
            break
    return {key.removeprefix("audit_") if key != "audited" else key: value for key, value in last.items()}


if __name__ == "__main__":
    sys.exit(main())
