"""Coding agents themselves (Claude Code, Codex, opencode, Qwen Code) against a running workbench, each
request they send logged on its way.

Their request shapes change from release to release (a field added to every request is enough to lock a
client out), and the SDK-based tests only send the shapes we know of. This installs the pinned releases
from the npm registry (once, into ~/.cache/workbench/clients), puts a logging proxy in front of the
server, runs each program once on a small prompt with the settings docs/PROTOCOL.md gives, and prints
what each printed and, per request, its route, its top-level fields and our answer's status (and error).
The proxy hands a stream on once it has ended: what the clients see is right, its timing is not.

    PYTHONPATH=. .venv/bin/python bench/real_clients.py --server http://127.0.0.1:8000 --token wb_... \\
        --model smollm2

Needs node and npm; a client that does not install is reported and skipped.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

CLIENTS = {"claude": "@anthropic-ai/claude-code@2.1.328", "codex": "@openai/codex@0.169.0",
           "opencode": "opencode-ai@1.18.33", "qwen": "@qwen-code/qwen-code@0.24.4"}
INSTALL_DIR = Path.home() / ".cache" / "workbench" / "clients"
PROMPT = "Say hello in five words."


def installed(name: str) -> Path | None:
    binary = INSTALL_DIR / "node_modules" / ".bin" / name
    if not binary.exists():
        INSTALL_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", CLIENTS[name]], cwd=INSTALL_DIR,
                       capture_output=True, timeout=600)
    return binary if binary.exists() else None


def logging_proxy(upstream: str, log: list[dict]) -> http.server.ThreadingHTTPServer:
    """A proxy on a free local port that forwards every request and notes its fields and our answer."""
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
            request = urllib.request.Request(upstream + self.path, data=body or None, method=self.command,
                                             headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=900) as answer:
                    status, answer_headers, data = answer.status, answer.headers, answer.read()
            except urllib.error.HTTPError as exc:
                status, answer_headers, data = exc.code, exc.headers, exc.read()
            fields = sorted(json.loads(body)) if body.strip().startswith(b"{") else []
            log.append({"path": self.path, "fields": fields, "status": status,
                        "error": data[:300].decode(errors="replace") if status >= 400 else None})
            self.send_response(status)
            for key, value in answer_headers.items():
                if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_claude(binary: Path, proxy: str, token: str, model: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": proxy, "ANTHROPIC_AUTH_TOKEN": token,
           "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    # Its own system prompt and tools are ~12,000 tokens: a small model's length needs them left out.
    return subprocess.run([str(binary), "-p", "--system-prompt", "You are brief.", "--tools", "", "--", PROMPT],
                          env=env, capture_output=True, text=True, timeout=900)


def run_codex(binary: Path, proxy: str, token: str, model: str, home: Path) -> subprocess.CompletedProcess:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        f'web_search = "disabled"\nmodel = "{model}"\nmodel_provider = "workbench"\n\n[features]\ngoals = false\n\n'
        f'[model_providers.workbench]\nname = "workbench"\nbase_url = "{proxy}/v1"\nenv_key = "WB_KEY"\n'
        'wire_api = "responses"\n')
    return subprocess.run([str(binary), "exec", "--skip-git-repo-check", PROMPT], cwd=home, capture_output=True,
                          env={**os.environ, "HOME": str(home), "WB_KEY": token}, text=True, timeout=900)


def run_opencode(binary: Path, proxy: str, token: str, model: str, home: Path) -> subprocess.CompletedProcess:
    config = {"provider": {"workbench": {"npm": "@ai-sdk/openai-compatible", "name": "Workbench",
                                         "options": {"baseURL": f"{proxy}/v1", "apiKey": token},
                                         "models": {model: {"name": model, "limit": {"context": 8192, "output": 256}}}}},
              "model": f"workbench/{model}", "autoupdate": False, "share": "disabled"}
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps(config))
    return subprocess.run([str(binary), "run", PROMPT], cwd=home, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HOME": str(home)})


def run_qwen(binary: Path, proxy: str, token: str, model: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "OPENAI_BASE_URL": f"{proxy}/v1", "OPENAI_API_KEY": token,
           "OPENAI_MODEL": model}
    return subprocess.run([str(binary), "-p", PROMPT], cwd=home, env=env, capture_output=True, text=True, timeout=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True, help="an API token (python manage.py createapitoken USER)")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    for name, run in (("claude", run_claude), ("codex", run_codex), ("opencode", run_opencode), ("qwen", run_qwen)):
        binary = installed(name)
        if binary is None:
            print(f"{name}: {CLIENTS[name]} did not install from the npm registry; skipped")
            continue
        log: list[dict] = []
        proxy = logging_proxy(args.server, log)
        with tempfile.TemporaryDirectory() as home:
            try:
                done = run(binary, f"http://127.0.0.1:{proxy.server_port}", args.token, args.model, Path(home))
                said, code = done.stdout.strip() or done.stderr.strip(), str(done.returncode)
            except subprocess.TimeoutExpired:
                said, code = "", "none: still running after 900 s, stopped"
        proxy.shutdown()
        print(f"{name} ({CLIENTS[name]}): exit {code}; printed: {said[-300:]!r}")
        for entry in log:
            print(f"  {entry['path']} {entry['status']} fields={entry['fields']}"
                  + (f" error={entry['error']}" if entry["error"] else ""))


if __name__ == "__main__":
    main()
