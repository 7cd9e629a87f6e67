"""tests/e2e/conftest.py's report of a failed page test: what each page the test opened showed then, and
nothing of the pages an earlier test of the module opened in the same browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]

INNER = '''
from tests.e2e.conftest import new_page


def test_an_earlier_one(browser):
    new_page(browser).set_content("<p>an earlier test's page</p>")


def test_fails(browser):
    new_page(browser).set_content("<main><p>the reply ended</p><p>length, 496 tokens</p></main>")
    assert False
'''


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
def test_a_failed_page_tests_report_shows_its_own_pages_text(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for the conftest, loaded as a plugin in a folder of its own
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_inner=INNER)
    # -rP: a passing test's report sections are printed too, so one wrongly given a page would show.
    result = pytester.runpytest_subprocess("-p", "tests.e2e.conftest", "-p", "no:cacheprovider", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert output.count("Page about:blank") == 1, output
    assert "the reply ended" in output and "length, 496 tokens" in output, "the page's visible text"
    assert "an earlier test's page" not in output, "only the failed test's own pages"
