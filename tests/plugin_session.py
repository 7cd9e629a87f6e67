"""A pytest of its own for checking one of the suite's report plugins: `source` (a test module) run with
the plugin alone, in a folder of its own, with every report section printed, passes included."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def report_of(pytester, monkeypatch, plugin: str, source: str) -> str:
    """The session's output; `source` holds one passing test and one failing one, which it checks."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for the plugin, imported by name from this checkout
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # none of the suite's plugins: a second, not three
    pytester.makepyfile(test_inner=source)
    # -rP: a passing test's report sections are printed too, so one wrongly given a section would show.
    result = pytester.runpytest_subprocess("-p", plugin, "-p", "no:cacheprovider", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    return result.stdout.str()
