"""`make test`'s pytest run: the suite as two pytest processes side by side, one for the tests that
wait on servers and one for the rest.

The web and page tests (tests/workbench, tests/e2e) mostly wait: on Daphnes, Celery workers and
Chromium. One process running the whole suite left about a third of two cores idle. So those tests run in
one process, in file order as before, and everything else (the engine, the kernels, the mutation check)
in a second process beside it at a lower priority: it takes the cores the first leaves idle, not the time
that the server tests' races with the demo model need (a stop clicked before a 500-token reply ends).
pytest-xdist's two workers were faster still, but put two server tests side by side, and those races
were lost (docs/TESTING.md, "Two processes side by side").

Both processes, and every server they start, wait passively in OpenMP: by default torch's threads spin
after every parallel op, taking the cores the other process needs.

The server tests' output streams; the other process's is printed when both are done. Arguments go to
both (pytest-randomly's seed, say); the exit status is the first failing process's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

SERVER_TESTS = ["tests/workbench", "tests/e2e"]
# The other process's niceness: where both want a core, the server tests' processes get about nine times
# the others' share of it.
OTHERS_NICENESS = 10


def commands(args: list[str]) -> tuple[list[str], list[str]]:
    """(the server tests' pytest, the other tests' pytest) with `args` given to both."""
    pytest = [sys.executable, "-m", "pytest", *args]
    others = ["nice", "-n", str(OTHERS_NICENESS), *pytest, "tests", *(f"--ignore={path}" for path in SERVER_TESTS)]
    return [*pytest, *SERVER_TESTS], others


def main(args: list[str]) -> int:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    servers, others = commands(args)
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as others_output:
        other_tests = subprocess.Popen(others, env=env, stdout=others_output, stderr=subprocess.STDOUT)
        try:
            servers_status = subprocess.call(servers, env=env)
            others_status = other_tests.wait()
        finally:
            if other_tests.poll() is None:  # interrupted: leave nothing running
                other_tests.kill()
        others_output.seek(0)
        print(f"\n=== the tests outside {' and '.join(SERVER_TESTS)}, run beside them ===", flush=True)
        sys.stdout.write(others_output.read())
    print(f"both processes done in {time.monotonic() - start:.1f} s "
          f"(exit {servers_status} for the server tests, {others_status} for the others)")
    return servers_status or others_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
