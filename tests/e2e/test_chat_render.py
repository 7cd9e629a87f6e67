"""Replies people can use, in a real headless Chromium against a real Daphne: a stored reply's markdown
(a table, lists, a task list, a heading, a link, highlighted code) rendered as such; hostile markdown
inert; the copy buttons putting the right text on the clipboard; streaming renders only what changed
and ends where a whole render would; dark mode (the system's, and the toggle, remembered); the phone
layout's drawer; and axe-core finding no serious or critical violation on the chat page (light, dark,
375 px wide, drawer open), the conversation list, the API-token page, log in, sign up, the dashboard, the
admin, and the 404 and 403 pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ADMIN_PASSWORD
from tests.e2e.conftest import log_in, new_page, signed_up_in_a_new_conversation
from tests.e2e.stored_replies import store_exchange
from tests.users import unique_name

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
CODE = 'def greet(name: str) -> str:\n    return f"Hello, {name}!"  # a comment\n\nprint(greet("<b>you</b>"))'
RICH = f"""## Plan

| step | cost |
|------|-----:|
| load | 3 |
| run  | 12 |

- first item
- second item

1. one
2. two

- [x] done task
- [ ] open task

Read [the docs](https://example.com/docs) first.

```python
{CODE}
```
"""
HOSTILE = """<script>window.pwned = "script"</script>

<img src=x onerror="window.pwned = 'img'">

<a href="#" onclick="window.pwned = 'onclick'">html link</a> and <b onmouseover="window.pwned = 'b'">bold</b>

[a js link](javascript:window.pwned='link') and [a data link](data:text/html,<script>alert(1)</script>)

<javascript:window.pwned='autolink'>

![an image](javascript:window.pwned='image')

`<b>inline</b>`

```html
<img src=x onerror="window.pwned = 'code'"><script>window.pwned = 'code'</script>
```
"""
# Streamed, these change a block that is no longer the last one: "- b" after "- a" and a blank line makes
# the list loose (its items become paragraphs), and the dashes under a paragraph make it a heading.
REWRITES_EARLIER_BLOCKS = """- loose one

- loose two

Title after all
---
"""


# A whole render per character costs the square of the length: the streamed text is kept short.
STREAMED = ("## Plan\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n" + REWRITES_EARLIER_BLOCKS
            + "```python\ndef f():\n    return 1  # one\n```\nThen `code` and <b>html</b>.\n")


@pytest.fixture(scope="module")
def render_server(inprocess_daphne):
    """The session's in-process Daphne (rendering needs no Celery), its database file, and the admin."""
    inprocess_daphne.ensure_admin()
    return f"http://{inprocess_daphne.address}", inprocess_daphne.db_path


def open_stored_reply(browser, render_server, username: str, reply: str, question: str = "Show me"):
    base, db = render_server
    page = signed_up_in_a_new_conversation(browser, base, username)
    store_exchange(db, int(page.url.rsplit("/", 1)[1]), question, reply)
    page.reload()
    return page


def serious_violations(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now, one line each."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    violations = page.evaluate("""async () => (await axe.run(document, {resultTypes: ["violations"]}))
        .violations.filter((v) => v.impact === "serious" || v.impact === "critical")
        .map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`)""")
    return violations


def test_a_reply_renders_as_markdown_inert_copyable_and_streams_only_what_changed(browser, render_server):
    page = open_stored_reply(browser, render_server, unique_name("reader"), RICH + "\n" + HOSTILE)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=render_server[0])
    reply = page.locator("article.assistant .content")

    assert reply.locator("h2").inner_text() == "Plan"
    assert reply.locator("table thead th").all_inner_texts() == ["step", "cost"]
    assert reply.locator("table tbody tr").count() == 2
    assert reply.locator("table tbody td").nth(3).get_attribute("align") == "right"
    assert reply.locator("ul > li").all_inner_texts()[:2] == ["first item", "second item"]
    assert reply.locator("ol > li").all_inner_texts() == ["one", "two"]
    boxes = reply.locator("li > input[type=checkbox]")
    assert [boxes.nth(i).is_checked() for i in range(boxes.count())] == [True, False]
    assert all(boxes.nth(i).is_disabled() for i in range(boxes.count()))
    link = reply.get_by_role("link", name="the docs")
    assert (link.get_attribute("href"), link.get_attribute("target"), link.get_attribute("rel")) == \
        ("https://example.com/docs", "_blank", "noopener noreferrer")
    python = reply.locator("code.language-python")
    assert python.inner_text() == CODE + "\n"
    assert python.locator(".hljs-keyword").first.inner_text() == "def"
    assert python.locator(".hljs-string").count() >= 2 and python.locator(".hljs-comment").inner_text() == "# a comment"
    assert reply.locator(".code-block .code-bar span").first.inner_text() == "python"

    # Hostile markdown: nothing ran, no element carries a handler or a script URL, and the HTML shows as text.
    hostile = page.evaluate("""() => {
        const root = document.querySelector("article.assistant .content");
        root.querySelectorAll("a, b").forEach((el) => { el.click(); el.dispatchEvent(new MouseEvent("mouseover")); });
        const all = [...root.querySelectorAll("*")];
        return {pwned: window.pwned ?? null,
                tags: [...new Set(all.map((el) => el.tagName.toLowerCase()))].sort(),
                handlers: all.flatMap((el) => el.getAttributeNames().filter((name) => name.startsWith("on"))),
                hrefs: [...root.querySelectorAll("[href]")].map((el) => el.getAttribute("href")),
                text: root.textContent};
    }""")
    assert hostile["pwned"] is None and hostile["handlers"] == [], hostile
    assert not {"script", "img", "b", "iframe"} & set(hostile["tags"]), hostile["tags"]
    assert hostile["hrefs"] == ["https://example.com/docs"], hostile["hrefs"]
    for shown in ('<script>window.pwned = "script"</script>', "<img src=x onerror=\"window.pwned = 'img'\">",
                  "<b>inline</b>", "<img src=x onerror=\"window.pwned = 'code'\"><script>window.pwned = 'code'</script>"):
        assert shown in hostile["text"], shown
    assert reply.get_by_text("a js link").count() == 1 and reply.get_by_text("an image").count() == 1

    # Copy buttons: the code as written (no language bar, no trailing newline), the reply's markdown, the question.
    clipboard = "navigator.clipboard.readText()"
    copy_code = reply.get_by_role("button", name="Copy code").first
    copy_code.click()
    page.wait_for_function("() => [...document.querySelectorAll('.code-bar button')].some((b) => b.textContent === 'Copied')")
    assert page.evaluate(clipboard) == CODE
    page.get_by_role("button", name="Copy reply").click()
    assert page.evaluate(clipboard) == RICH + "\n" + HOSTILE
    page.get_by_role("button", name="Copy your message").click()
    page.wait_for_function("() => document.querySelector('article.user .actions button').textContent === 'Copied'")
    assert page.evaluate(clipboard) == "Show me"
    # The message's own text, not the copy button's label beside it, is what "Edit last message" puts
    # in the inline editor; Esc closes the editor and leaves the message as it was.
    page.wait_for_selector("#edit-last:not([disabled])")
    page.click("#edit-last")
    editor = page.locator("article.user textarea")
    assert editor.input_value() == "Show me"
    editor.press("Escape")
    page.wait_for_selector("article.user textarea", state="detached")

    # Streaming: rendered after every character, each render is exactly what a whole render of the same
    # text gives, while the first block keeps its node throughout (only the tail is rendered again).
    streamed = page.evaluate("""text => {
        const target = document.createElement("div");
        document.body.append(target);
        const differs = [];
        let first = null, kept = true;
        for (let end = 1; end <= text.length; end++) {
            renderMarkdown(target, text.slice(0, end));
            const whole = document.createElement("div");
            renderMarkdown(whole, text.slice(0, end));
            if (target.innerHTML !== whole.innerHTML) differs.push(end);
            if (end > 20) { first ??= target.firstElementChild; kept &&= target.firstElementChild === first; }
        }
        return {differs: differs.slice(0, 5), kept, heading: first.outerHTML};
    }""", STREAMED)
    assert streamed == {"differs": [], "kept": True, "heading": "<h2>Plan</h2>"}, streamed


def test_dark_mode_phone_drawer_and_no_serious_accessibility_violation(browser, render_server):
    base, _ = render_server
    found: dict[str, list[str]] = {}
    visitor = new_page(browser)
    for name in ("login", "signup"):
        visitor.goto(f"{base}/{name}")
        found[name] = serious_violations(visitor)

    page = open_stored_reply(browser, render_server, unique_name("viewer"), RICH)
    chat_url = page.url
    found["chat, light"] = serious_violations(page)
    background = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    toggle = page.get_by_role("button", name="Dark mode")
    assert toggle.get_attribute("aria-pressed") == "false"
    toggle.click()
    assert toggle.get_attribute("aria-pressed") == "true" and page.evaluate(background) != light
    dark = page.evaluate(background)
    found["chat, dark"] = serious_violations(page)
    page.goto(f"{base}/")
    assert page.evaluate(background) == dark, "the choice is remembered across pages"
    found["conversation list, dark"] = serious_violations(page)
    page.get_by_role("button", name="Dark mode").click()
    found["conversation list, light"] = serious_violations(page)
    assert page.evaluate(background) == light
    page.goto(f"{base}/tokens")
    found["API tokens"] = serious_violations(page)
    page.goto(f"{base}/?q=Show")
    assert page.locator("#search-results li").count() == 1, "liveness: the search found the stored question"
    found["search results"] = serious_violations(page)
    page.goto(chat_url)
    page.click("#settings summary")
    page.click("#rename-button")
    assert page.locator("#rename-form").is_visible() and page.locator("#system_prompt").is_visible()
    found["chat, settings and rename open"] = serious_violations(page)

    # A system in dark mode gets dark pages without touching the toggle, and the toggle still wins.
    system_dark = browser.new_context(color_scheme="dark")
    night = system_dark.new_page()
    night.goto(f"{base}/login")
    assert night.evaluate(background) == dark
    assert night.get_by_role("button", name="Dark mode").get_attribute("aria-pressed") == "true"
    night.get_by_role("button", name="Dark mode").click()
    assert night.evaluate(background) == light
    system_dark.close()

    # A phone: nothing wider than the screen, the conversation list a drawer behind a labelled toggle.
    page.goto(chat_url)
    page.set_viewport_size({"width": 375, "height": 740})
    drawer, drawer_toggle = page.locator("#conversation-list"), page.get_by_role("button", name="Conversations")
    assert not drawer.is_visible() and drawer_toggle.get_attribute("aria-expanded") == "false"
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    found["chat, 375 px"] = serious_violations(page)
    drawer_toggle.click()
    assert drawer.is_visible() and drawer_toggle.get_attribute("aria-expanded") == "true"
    in_drawer = "document.getElementById('conversation-list').contains(document.activeElement)"
    assert page.evaluate(in_drawer)
    found["chat, 375 px, drawer open"] = serious_violations(page)
    # Modal while open: Tab and Shift+Tab go round the drawer's own controls (more presses than it has)
    # and never reach the page behind it.
    stops = page.evaluate("document.querySelectorAll('#conversation-list a, #conversation-list button, "
                          "#conversation-list input').length")
    for key in ["Tab"] * (stops + 2) + ["Shift+Tab"] * (stops + 2):
        page.keyboard.press(key)
        assert page.evaluate(in_drawer), (key, page.evaluate("document.activeElement.outerHTML.slice(0, 80)"))
    # The page behind is inert, not only skipped by Tab: nothing there takes focus, even when asked.
    for behind in ("input", "theme-toggle", "drawer-toggle"):
        page.evaluate(f"document.getElementById({behind!r}).focus()")
        assert page.evaluate(in_drawer), behind
    page.keyboard.press("Escape")
    assert not drawer.is_visible() and page.evaluate("document.activeElement.id") == "drawer-toggle"
    page.set_viewport_size({"width": 1280, "height": 800})
    assert drawer.is_visible() and not drawer_toggle.is_visible()

    operator = new_page(browser)
    log_in(operator, base, "admin", ADMIN_PASSWORD)
    operator.goto(f"{base}/ops/dashboard")
    operator.wait_for_selector('#connection[data-state="live"]')
    operator.wait_for_function("document.querySelectorAll('#workers .worker').length >= 1")
    found["dashboard"] = serious_violations(operator)
    operator.get_by_role("button", name="Dark mode").click()
    found["dashboard, dark"] = serious_violations(operator)
    operator.goto(f"{base}/admin/")
    found["admin"] = serious_violations(operator)
    operator.goto(f"{base}/admin/chat/conversation/")
    found["admin, conversations"] = serious_violations(operator)
    assert page.goto(f"{base}/c/999999").status == 404
    found["404"] = serious_violations(page)
    assert page.goto(f"{base}/ops/dashboard").status == 403  # the viewer is not staff
    found["403"] = serious_violations(page)
    assert found == {name: [] for name in found}, found
    assert re.match(r"rgb", light), "liveness: the colours were read"
