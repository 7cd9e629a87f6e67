"""tests/e2e/conftest.py's report of a failed page test: what each page the test opened showed then, and
nothing of the pages an earlier test of the module opened in the same browser."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import CHROMIUM
from tests.plugin_session import report_of

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
    output = report_of(pytester, monkeypatch, "tests.e2e.conftest", INNER)
    assert output.count("Page about:blank") == 1, output
    assert "the reply ended" in output and "length, 496 tokens" in output, "the page's visible text"
    assert "an earlier test's page" not in output, "only the failed test's own pages"
