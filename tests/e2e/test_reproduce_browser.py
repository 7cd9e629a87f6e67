"""The chat page's "Reproduce" in a real Chromium: a sampled reply (temperature 0.8, no seed given) is
re-derived from its record and shown "identical", and the same after the server restarted over the
same database (the record lives with the stored message). A Daphne of this module's own, since it is
restarted; the demo model."""

from __future__ import annotations

import os

import pytest

from tests.cluster import start_daphne
from tests.e2e.conftest import signed_up_in_a_new_conversation
from tests.users import unique_name


class Restartable:
    def __init__(self, db_path) -> None:
        self.env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess"}
        self.db_path = db_path
        self.process, self.address, _ = start_daphne(self.env, db_path)

    def restart(self) -> None:
        self.stop()
        self.process, self.address, _ = start_daphne(self.env, self.db_path)  # over the same database

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = Restartable(tmp_path_factory.mktemp("reproduce") / "db.sqlite3")
    yield served
    served.stop()


def reproduced(page) -> str:
    page.click("article.assistant .reproduce button")
    result = page.locator("article.assistant .reproduce-result")
    page.wait_for_function("!document.querySelector('article.assistant .reproduce-result')"
                           ".textContent.startsWith('reproducing')")
    return result.inner_text()


def test_a_sampled_unseeded_reply_reproduces_identical_also_after_a_restart(browser, server):
    page = signed_up_in_a_new_conversation(browser, f"http://{server.address}", unique_name("rory"))
    conversation = page.url.rsplit("/", 1)[1]
    page.click("details summary")  # the sampling controls
    page.fill("#temperature", "0.8")  # sampled, and no seed: the engine draws one and records it
    page.fill("#max_tokens", "12")
    page.fill("#input", "Tell me about lists")
    page.click("#send")
    page.locator("article.assistant .reproduce button").wait_for()
    assert reproduced(page) == "identical"

    server.restart()  # a new process, a new engine; the session and the record are in the database
    page.goto(f"http://{server.address}/c/{conversation}")
    assert reproduced(page) == "identical"
