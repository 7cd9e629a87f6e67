"""A real headless Chromium (Debian's, driven by Playwright) for the page tests, and the steps they share."""

from __future__ import annotations

import re
import shutil

import pytest

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Playwright's default wait is 30 s; a reply on a loaded 2-core machine can take longer, and a wait
# that passes costs only the time it takes.
WAIT_MS = 90_000


def pytest_collection_modifyitems(config, items):
    if CHROMIUM is None:
        skip = pytest.mark.skip(reason="Debian's chromium is not installed (make test installs it)")
        for item in items:
            if "browser" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


# How many browser contexts were open when a test's call began: the pages of the later ones are its own.
CONTEXTS_BEFORE = pytest.StashKey[int]()
PAGE_TEXT_CHARS = 3_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    browser = item.funcargs.get("browser")
    if browser is not None:
        item.stash[CONTEXTS_BEFORE] = len(browser.contexts)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed page test's report ends with what each page it opened showed then: a race lost in CI (a
    reply that ended before Stop was clicked) is told by the page, not guessed at."""
    report = yield
    if report.failed and call.when == "call" and CONTEXTS_BEFORE in item.stash:
        for title, text in page_states(item.funcargs["browser"], item.stash[CONTEXTS_BEFORE]):
            report.sections.append((title, text))
    return report


def page_states(browser, first_context: int) -> list[tuple[str, str]]:
    """(a title naming the page's address, the end of its visible text) of each page of the browser's
    contexts from `first_context` on."""
    states = []
    for context in browser.contexts[first_context:]:
        for page in context.pages:
            try:
                text = page.inner_text("body", timeout=2_000)[-PAGE_TEXT_CHARS:]
            except playwright.Error as exc:  # closed, or hung
                text = f"(unreadable: {exc})"
            states.append((f"Page {page.url} (the last {PAGE_TEXT_CHARS} characters of its text)", text))
    return states


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield instance
        instance.close()


def new_page(browser, enforce_csp: bool = False):
    """A page in a fresh context (its own cookies: its own user), waiting up to WAIT_MS by default.

    The pages' content-security policy forbids eval, which Playwright's wait_for_function polls with, so
    contexts ignore it unless `enforce_csp` (tests/e2e/test_content_security.py, which checks the pages
    and a live reply under the policy)."""
    context = browser.new_context(bypass_csp=not enforce_csp)
    context.set_default_timeout(WAIT_MS)
    return context.new_page()


def sign_up(page, base: str, username: str) -> None:
    """Signs up, then logs in on the page sign-up lands on (its name filled in)."""
    page.goto(f"{base}/signup")
    page.fill("#id_username", username)
    page.fill("#id_password1", "a-long-pass-9!")
    page.fill("#id_password2", "a-long-pass-9!")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/login\?.*signed_up=1.*"))
    page.fill("#id_password", "a-long-pass-9!")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def signed_up_in_a_new_conversation(browser, base: str, username: str, enforce_csp: bool = False):
    """A new user's page, signed up and in a conversation of its own."""
    page = new_page(browser, enforce_csp)
    sign_up(page, base, username)
    page.click("#new-conversation")
    page.wait_for_url(re.compile(r".*/c/\d+$"))
    return page


def log_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/login")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
