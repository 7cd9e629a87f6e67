"""A fork server for the mutation check's scratch runs: one Python that has imported, once, the
third-party modules every run imports, and forks a child per run that runs pytest in a scratch copy.

Why: a run's named tests take one to a few seconds, but a fresh interpreter spends about 4 s of each run
importing (measured with `python -X importtime` on the named tests, two cores): torch 1.6 s and sympy
through torch.fx another 0.5 s, then Django, redis, jsonschema, numpy, gguf and pytest.

What it never imports is the project's own packages (engine, workbench, tests, bench): each run imports
them as a fresh interpreter in its copy would, engine and tests from the copy, mutated or not, and a module
loaded here would stand in for the mutant's. The server refuses to start if preloading pulled one in, and
each child still checks that the engine it imports is its copy's. Nor does it import what a pytest
plugin's distribution ships (anyio, hypothesis, pytest-django, ...): pytest rewrites the asserts of those
at its start, and warns for each one it finds imported already. transformers imports anyio, so it is left
out too (only the run that builds the shared checkpoints needs it). Nor what cannot be imported without
the copy's settings (Django's apps) or starts something when imported (daphne.server installs Twisted's
reactor with an open event loop). torch is imported and never used here, so its thread pools start in
each child.

Started as a script (`python -P preloaded.py`, no PYTHONPATH): as tests.mutation.preloaded it would import
the `tests` package.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

PRELOAD = ("pytest", "numpy", "torch", "torch.fx.experimental.symbolic_shapes", "torch.utils.cpp_extension",
           "gguf", "jsonschema", "llguidance", "redis", "django.urls", "django.test")
PROJECT = ("engine", "workbench", "tests", "bench")
NOT_THE_COPY = "the engine imported is not the scratch copy's:"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class PreloadError(RuntimeError):
    """The server cannot serve a run, or a run did not end; the test fails with this, never falls back."""


def _imported_by_pytest_itself() -> set[str]:
    """The top-level modules of every distribution that registers a pytest plugin (as pytest finds them
    to rewrite their asserts)."""
    names = set()
    for dist in importlib.metadata.distributions():
        if any(entry.group == "pytest11" for entry in dist.entry_points):
            for file in dist.files or ():
                if len(file.parts) == 1 and file.suffix == ".py":
                    names.add(file.stem)
                elif len(file.parts) == 2 and file.parts[1] == "__init__.py":
                    names.add(file.parts[0])
    return names


def _point(fd: int, path: str, flags: int) -> None:
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict, inherited: tuple[int, ...]) -> NoReturn:
    """Runs pytest in the copy as a fresh `python -c` started there would, then exits without returning
    into the server's loop."""
    code = 1
    try:
        # Killed with the server: once it is gone, nothing would reap this run or kill it at its timeout.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for fd in inherited:
            os.close(fd)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            _point(fd, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        copy = request["copy"]
        os.chdir(copy)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path.insert(0, copy)
        import engine
        if engine.__file__ and engine.__file__.startswith(copy):
            import pytest
            code = pytest.main(request["args"])
        else:
            print(NOT_THE_COPY + str(engine.__file__), file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))


def _serve_one(request: dict, inherited: tuple[int, ...]) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, inherited)
    if _threads() != 1:
        # Only a pool that stops itself around a fork may run here (numpy's OpenBLAS does, in pthread_atfork);
        # any other (torch's, once used) would leave the child without its threads and with its locks held.
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise PreloadError(f"the server ran {_threads()} threads across a fork; nothing may compute here")
    pidfd = os.pidfd_open(pid)
    ended = select.select([pidfd], [], [], request["timeout"])[0]
    os.close(pidfd)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": not ended}


def serve() -> None:
    """Requests on stdin, replies on stdout, one JSON line each; stray output of imports goes to stderr."""
    requests, replies = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
    _point(0, os.devnull, os.O_RDONLY)
    os.dup2(2, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    loaded = {name.split(".")[0] for name in sys.modules} & (set(PROJECT) | _imported_by_pytest_itself())
    if loaded:
        raise PreloadError(f"preloading imported {sorted(loaded)}, which each run must import itself")
    replies.write(json.dumps({"ready": sorted(PRELOAD)}) + "\n")
    replies.flush()
    for line in requests:
        replies.write(json.dumps(_serve_one(json.loads(line), (requests.fileno(), replies.fileno()))) + "\n")
        replies.flush()


class PreloadedPython:
    """The test side: starts the server, hands it runs, and fails loudly when it cannot answer."""

    def __init__(self, folder: Path, start_timeout: float = 300, threads: int | None = None) -> None:
        """`threads`: the OpenMP threads of each run's torch (OMP_NUM_THREADS, read where the server loads
        torch, so it holds in every child)."""
        self.folder = folder
        self.log = folder / "server.log"
        self.runs = 0
        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        with self.log.open("w") as log:
            self.process = subprocess.Popen([sys.executable, "-P", __file__], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, env=env, bufsize=0)
        self._reply(start_timeout)

    def run(self, copy: Path, args: list[str], env: dict[str, str], timeout: float
            ) -> subprocess.CompletedProcess:
        self.runs += 1
        out, err = self.folder / f"run{self.runs}.stdout", self.folder / f"run{self.runs}.stderr"
        request = {"copy": str(copy), "args": args, "env": env, "timeout": timeout, "stdout": str(out),
                   "stderr": str(err)}
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
        except BrokenPipeError:
            raise PreloadError(f"the preloaded python is gone{self._log_tail()}") from None
        reply = self._reply(timeout + 60)
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if reply["timed_out"]:
            raise PreloadError(f"the run in {copy} did not end in {timeout:.0f} s and was killed; its output "
                               f"ends:\n{stdout[-3000:]}\n{stderr[-3000:]}")
        return subprocess.CompletedProcess(args, reply["returncode"], stdout, stderr)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _reply(self, timeout: float) -> dict:
        assert self.process.stdout is not None
        deadline, line = time.monotonic() + timeout, b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                raise PreloadError(f"the preloaded python did not answer in {timeout:.0f} s{self._log_tail()}")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                code = self.process.wait(timeout=30)
                raise PreloadError(f"the preloaded python exited (code {code}){self._log_tail()}")
            line += chunk
        return json.loads(line)

    def _log_tail(self) -> str:
        return f"; its log ({self.log}) ends:\n{self.log.read_text(errors='replace')[-3000:]}"


if __name__ == "__main__":
    serve()
