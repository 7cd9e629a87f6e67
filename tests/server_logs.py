"""A pytest plugin (loaded by tests/conftest.py) that ends a failed test's report with the last lines of
every server log written while the test ran: the Daphnes and Celery workers that tests/cluster.py starts
log to files under pytest's temporary folder, which is gone with CI's clone once the run ends. A race
lost in CI is then told by its own servers, not guessed at.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

TAIL_LINES = 40
_LOGS: list[Path] = []  # every server log this pytest process has started, in order


def register(log: Path) -> None:
    """A server's log file, just opened: a test that fails while it is written shows its tail."""
    _LOGS.append(Path(log))


def tails_written_since(started: float) -> list[tuple[str, str]]:
    """(name, last lines) of each registered log modified at or after `started` (time.time())."""
    tails = []
    for log in _LOGS:
        try:
            if log.stat().st_mtime < started:
                continue
            lines = log.read_text(errors="replace").splitlines()
        except OSError:  # removed with its temporary folder
            continue
        tails.append((f"{log.parent.name}/{log.name}", "\n".join(lines[-TAIL_LINES:])))
    return tails


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.when == "call":
        for name, tail in tails_written_since(call.start):
            report.sections.append((f"Captured {name} (its last {TAIL_LINES} lines)", tail))
    return report
