"""Every page works under the content-security policy it is sent with, in a real headless Chromium against the
session's shared in-process Daphne: the header is there, and the browser reports no violation on the sign-in
and sign-up pages, the conversation list, a conversation whose stored reply renders markdown (a table,
highlighted code, a link) and which then streams a live reply over its websocket, the token page, the
dashboard, and the admin's pages. (The other page tests ignore the policy: Playwright's waits evaluate
strings, which it forbids.) A violation means a feature the policy silently breaks (a blocked script or
style).

Liveness: the same listener sees the violation when the page is made to run an inline script, and the script
does not run."""

from __future__ import annotations

from tests.conftest import ADMIN_PASSWORD
from tests.users import unique_name
from tests.e2e.conftest import log_in, new_page, signed_up_in_a_new_conversation
from tests.e2e.stored_replies import store_exchange

# Collects the browser's violation reports from the first script on; Playwright's init scripts run
# outside the page's policy.
REPORT_VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation",
    (event) => window.violations.push(`${event.violatedDirective} ${event.blockedURI} ${event.sourceFile}:${event.lineNumber}`));
"""
REPLY = ("| a | b |\n|:-:|--:|\n| 1 | 2 |\n\n```python\ndef f(x):\n    return x * 2\n```\n\n"
         "See [the docs](https://example.org/docs) and `inline code`.")


def watched_page(browser):
    page = new_page(browser, enforce_csp=True)
    page.add_init_script(REPORT_VIOLATIONS)
    return page


def visit(page, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.ok, url
    assert "default-src 'self'" in (response.header_value("content-security-policy") or ""), \
        f"{url} is sent without the policy"
    page.wait_for_load_state("networkidle")
    assert page.evaluate("window.violations") == [], f"{url}: the policy blocked part of the page"


def test_the_chat_pages_break_nothing_under_the_policy(browser, inprocess_daphne):
    base = f"http://{inprocess_daphne.address}"
    anonymous = watched_page(browser)
    visit(anonymous, f"{base}/login")
    visit(anonymous, f"{base}/signup")
    page = signed_up_in_a_new_conversation(browser, base, unique_name("csp-reader"), enforce_csp=True)
    page.add_init_script(REPORT_VIOLATIONS)
    conversation = int(page.url.rsplit("/", 1)[1])
    store_exchange(inprocess_daphne.db_path, conversation, "Show me a table", REPLY)
    visit(page, page.url)
    assert page.locator(".message table").count() == 1, "liveness: the reply's markdown rendered"
    assert page.locator(".message pre code .hljs-keyword").count() >= 1, "liveness: the code was highlighted"
    # A live reply over the page's websocket (connect-src), streamed and rendered under the policy.
    page.click("details summary")  # the sampling controls: a short greedy reply
    page.fill("#max_tokens", "8")
    page.fill("#temperature", "0")
    page.fill("#input", "Tell me about lists")
    page.click("#send")
    page.locator("article.assistant:last-of-type .meta").wait_for()
    assert page.locator("article.assistant:last-of-type .content").inner_text().strip(), "liveness: a reply came"
    assert page.evaluate("window.violations") == [], "the live reply broke the policy"
    visit(page, f"{base}/")
    visit(page, f"{base}/tokens")


def test_the_operator_pages_break_nothing_under_the_policy(browser, inprocess_daphne):
    inprocess_daphne.ensure_admin()
    base = f"http://{inprocess_daphne.address}"
    page = watched_page(browser)
    visit(page, f"{base}/admin/login/")
    log_in(page, base, "admin", ADMIN_PASSWORD)
    visit(page, f"{base}/ops/dashboard")
    for path in ("/admin/", "/admin/chat/conversation/", "/admin/chat/message/", "/admin/auth/user/",
                 "/admin/auth/user/add/", "/admin/api/apitoken/"):
        visit(page, base + path)


def test_an_inline_script_is_blocked_and_reported(browser, inprocess_daphne):
    page = watched_page(browser)
    visit(page, f"http://{inprocess_daphne.address}/login")
    page.evaluate("""() => {
        const script = document.createElement("script");
        script.textContent = "window.ran = true";
        document.body.appendChild(script);
    }""")
    assert page.evaluate("window.ran") is None, "an inline script ran under the policy"
    assert any(v.startswith("script-src") for v in page.evaluate("window.violations")), \
        "the listener the other tests rely on saw no violation"
