"""tests/server_logs.py: a failed test's report ends with the last lines of each server log written while
it ran, and of no other; a passing test's report carries none."""

from __future__ import annotations

from tests.plugin_session import report_of

pytest_plugins = ["pytester"]

INNER = '''
from pathlib import Path

from tests.server_logs import TAIL_LINES, register

HERE = Path(__file__).parent
quiet, busy = HERE / "quiet.log", HERE / "busy.log"
quiet.write_text("written before any test ran\\n")
busy.write_text("")
register(quiet)
register(busy)


def write_busy(what):
    with busy.open("a") as log:
        log.write("".join(f"{what} line {i:03d}\\n" for i in range(TAIL_LINES + 10)))


def test_passes():
    write_busy("passing")


def test_fails():
    write_busy("failing")
    assert False
'''


def test_a_failed_tests_report_shows_the_tail_of_the_logs_written_while_it_ran(pytester, monkeypatch):
    output = report_of(pytester, monkeypatch, "tests.server_logs", INNER)
    assert output.count("Captured ") == 1 and "busy.log (its last 40 lines)" in output, output
    assert "failing line 049" in output and "failing line 010" in output, "the last lines"
    assert "failing line 009" not in output, "no more than the last lines"
    assert "quiet" not in output, "a log not written while the test ran is left out"
