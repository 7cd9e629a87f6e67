"""The operator dashboard in a real headless Chromium against a real Daphne over two real Celery workers:
a staff operator watches a chat's sequence appear and cancels it from the page, flips the device loop off for one worker
and sees it in force there and nowhere else; a user who is not staff gets no dashboard and no flag
change, over HTTP or the socket."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.conftest import ADMIN_PASSWORD
from tests.e2e.conftest import log_in, new_page, sign_up
from tests.users import unique_name
from workbench.serving.transport import FINISHED_FIRST, NOT_HELD

USER = unique_name("dash-carol")  # on the Daphne the session shares, a user no other test meets
PICKED = {"picked_for_the_replay_audit": True}


@pytest.fixture(scope="module")
def cluster_server(celery_daphne):
    """The session's Daphne over the Celery workers, with the admin user (staff, every permission)."""
    celery_daphne.ensure_admin()
    return f"http://{celery_daphne.address}"


def device_loop_cell(page, worker: str):
    return page.locator(f'#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] td[data-worker="{worker}"]')


def dashboard_answer(operator, button) -> dict | None:
    """The dashboard's answer to a click on `button` (the answer box's JSON, once it has come); None
    where the button's row was gone before it could be clicked."""
    operator.evaluate("document.querySelector('#flag-answer').textContent = ''")
    try:
        button.click(timeout=5_000)
    except PlaywrightTimeout:
        return None
    operator.wait_for_function("document.querySelector('#flag-answer').textContent !== ''")
    return json.loads(operator.locator("#flag-answer").inner_text())


def chat_canceled_from_the_dashboard(operator, chat, base: str, workers: list[str]) -> bool:
    """A new chat of USER's, seen on the dashboard, picked there for the replay audit and canceled: True
    once its reply ended canceled, False where the reply ended first (its length reached) and the
    dashboard answered that it no longer held it."""
    chat.goto(f"{base}/")
    chat.click("#new-conversation")
    chat.wait_for_url(re.compile(r".*/c/\d+$"))
    chat.click("details summary")
    chat.fill("#max_tokens", "")  # none: the reply runs to the model's length
    chat.fill("#temperature", "0")
    chat.fill("#input", "Tell me about lists")
    chat.click("#send")
    row = operator.locator('#sequences tbody tr[data-request^="chat-"]')
    row.wait_for(timeout=20_000)
    assert row.locator(".user").inner_text() == USER
    assert row.get_attribute("data-worker") in workers
    # The worker that holds it audits it once it ends; then the engine's operator abort stops it, in the
    # audit log whatever it answers.
    picked = dashboard_answer(operator, row.locator("button.audit-request"))
    canceled = dashboard_answer(operator, row.locator("button.cancel-request")) if picked == PICKED else picked
    meta = chat.locator("article.assistant .meta")
    meta.wait_for(timeout=60_000)  # the reply finished
    row.wait_for(state="detached", timeout=20_000)  # so the next attempt's row is the next chat's
    if canceled is None or canceled.get("error") in (NOT_HELD, FINISHED_FIRST):
        assert meta.inner_text().startswith("length"), (canceled, meta.inner_text())
        return False
    assert picked == PICKED and set(canceled) == {"canceled", "audit_log_entry"}, (picked, canceled)
    assert meta.inner_text().startswith("canceled"), meta.inner_text()
    return True


def test_an_operator_watches_a_chat_and_flips_one_worker(browser, cluster_server):
    base = cluster_server
    operator = new_page(browser)
    log_in(operator, base, "admin", ADMIN_PASSWORD)
    operator.goto(f"{base}/admin/")
    operator.click("#ops-links a")  # the dashboard is linked from the admin
    operator.wait_for_selector('#connection[data-state="live"]')
    operator.wait_for_function("document.querySelectorAll('#workers .worker').length >= 2")
    workers = sorted(operator.eval_on_selector_all("#workers .worker", "cards => cards.map(c => c.dataset.worker)"))

    chat = new_page(browser)
    sign_up(chat, base, USER)
    # The operator acts on what the workers' heartbeats showed, a second or more behind on a busy host,
    # and the demo model's whole reply can take 2 s: where it ends before the pick or the cancel reaches
    # it, the dashboard says so (the cancel's answer is its engine's), and the test starts another chat.
    if not any(chat_canceled_from_the_dashboard(operator, chat, base, workers) for _ in range(3)):
        pytest.fail("three replies in a row ended before the operator's cancel reached them")
    # The worker that ran it shows its prefix cache: on, for each user alone, with a hit rate.
    operator.wait_for_function("() => [...document.querySelectorAll('#workers .prefix-cache')]"
                               ".some(d => d.textContent.startsWith('on, scope user') && d.textContent.includes('hit rate'))")

    # Device loop on everywhere, then off for the first worker only.
    operator.click('#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] button.flip[data-worker=""][data-value="true"]')
    for worker in workers:
        operator.wait_for_selector(f'#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] td[data-worker="{worker}"][data-value="true"]')
    device_loop_cell(operator, workers[0]).locator("button.flip").click()
    operator.wait_for_selector(f'#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] td[data-worker="{workers[0]}"][data-value="false"]')
    operator.wait_for_selector(f'#workers .worker[data-worker="{workers[0]}"] .device-loop[data-engaged="false"]')
    answer = operator.locator("#flag-answer").inner_text()
    assert workers[0] in answer and workers[1] not in answer, "the change was asked of one worker"
    assert device_loop_cell(operator, workers[1]).get_attribute("data-value") == "true", "and the other kept it"
    # The audit log's newest row, on the page: who asked it of which worker.
    operator.wait_for_function("w => document.querySelector('#changes tbody tr').textContent.includes(w)", arg=workers[0])
    assert operator.locator("#changes tbody tr").first.locator(".who").inner_text() == "admin"
    assert operator.locator(f'#workers .worker[data-worker="{workers[1]}"] .device-loop').get_attribute("data-engaged") == "true"

    # ARC_CAPTURE_STREAM cannot change: the answer says what capture is on each worker.
    operator.click('#flags tr[data-flag="ARC_CAPTURE_STREAM"] button.flip[data-worker=""][data-value="true"]')
    operator.wait_for_function("document.querySelector('#flag-answer').textContent.includes('fixed at start')")
    assert "capture here is cpu-replay" in operator.locator("#flag-answer").inner_text()

    operator.click('#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] button.flip[data-worker=""][data-value="false"]')
    for worker in workers:  # back to how the session's other tests expect the workers
        operator.wait_for_selector(f'#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] td[data-worker="{worker}"][data-value="false"]')

    # The chat user is not staff: no page, no socket, no flag change.
    assert chat.goto(f"{base}/ops/dashboard").status == 403
    opened = chat.evaluate("""() => new Promise(resolve => {
        const ws = new WebSocket(`ws://${location.host}/ws/ops/dashboard`);
        ws.onopen = () => resolve("opened");
        ws.onclose = () => resolve("refused");
    })""")
    assert opened == "refused"
    status = chat.evaluate("""async () => {
        const csrf = document.cookie.split("; ").find(c => c.startsWith("csrftoken=")).split("=")[1];
        const response = await fetch("/ops/flags", {method: "POST", headers: {"X-CSRFToken": csrf,
            "Content-Type": "application/json"}, body: JSON.stringify({name: "ARC_GRAPH_DEVICE_LOOP", value: true})});
        return [response.status, (await response.json()).error];
    }""")
    assert status == [403, "operators only (staff with the ops.flip_flags permission)"]
    operator.reload()
    operator.wait_for_selector('#connection[data-state="live"]')
    for worker in workers:
        operator.wait_for_selector(f'#flags tr[data-flag="ARC_GRAPH_DEVICE_LOOP"] td[data-worker="{worker}"][data-value="false"]')
