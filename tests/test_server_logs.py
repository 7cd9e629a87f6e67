"""tests/server_logs.py: a failed test's report ends with the last lines of each server log written while
it ran, and of no other; a passing test's report carries none."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for the plugin, in a pytest of its own in a folder of its own
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # none of the suite's plugins: a second, not three
    pytester.makepyfile(test_inner=INNER)
    # -rP: a passing test's report sections are printed too, so one wrongly given a log would show.
    result = pytester.runpytest_subprocess("-p", "tests.server_logs", "-p", "no:cacheprovider", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert output.count("Captured ") == 1 and "busy.log (its last 40 lines)" in output, output
    assert "failing line 049" in output and "failing line 010" in output, "the last lines"
    assert "failing line 009" not in output, "no more than the last lines"
    assert "quiet" not in output, "a log not written while the test ran is left out"
