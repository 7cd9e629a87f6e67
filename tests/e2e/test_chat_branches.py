"""Branches in a real headless Chromium against a real Daphne: a middle message edited in place forks a
new branch, answered; after a reload the old branch is one `<` away, whole, and the new one one `>`
away, whole; the editor offers the message's own words, and Esc leaves everything as it was."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import signed_up_in_a_new_conversation

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
QUESTIONS = ["first question", "second question", "third question"]


def serious_violations(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    return page.evaluate("""async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
        .filter((v) => v.impact === "serious" || v.impact === "critical").map((v) => v.id)""")


def answered(page, count: int) -> None:
    page.wait_for_function(f"""document.querySelectorAll('article.assistant .meta').length === {count}
                               && !document.querySelector('article[data-streaming]')""")


def conversation(page) -> list[tuple[str, str]]:
    """The messages shown, as (role, text)."""
    return [tuple(pair) for pair in page.evaluate("""() => [...document.querySelectorAll('#messages article')]
        .map((a) => [a.dataset.role, a.querySelector('.content').textContent])""")]


def test_editing_a_middle_message_forks_a_branch_and_both_stay_reachable_after_a_reload(browser, daphne_server):
    page = signed_up_in_a_new_conversation(browser, f"http://{daphne_server[0]}", "brancher")
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.click("#settings summary")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "5")
    for n, question in enumerate(QUESTIONS, 1):
        page.fill("#input", question)
        page.click("#send")
        answered(page, n)
    old_branch = conversation(page)
    assert [text for role, text in old_branch if role == "user"] == QUESTIONS

    second = page.locator("article.user").nth(1)
    edit = second.get_by_role("button", name="Edit your message")
    edit.click()
    editor = second.get_by_role("textbox", name="Edited message")
    assert editor.input_value() == "second question", "the message's words, not a button's label"
    editor.fill("changed my mind")
    editor.press("Escape")  # cancelled: nothing sent, nothing changed
    assert not editor.count() and conversation(page) == old_branch
    page.click("#edit-last")  # the same editor, on the last message
    assert page.locator("article.user").nth(2).get_by_role("textbox", name="Edited message").input_value() == "third question"
    page.locator("article.user").nth(2).get_by_role("button", name="Cancel").click()

    edit.click()
    assert serious_violations(page) == [], "the page with an editor open"
    editor.fill("second question, reworded")
    second.get_by_role("button", name="Save and send").click()
    answered(page, 2)
    new_branch = conversation(page)
    assert [role for role, _ in new_branch] == ["user", "assistant"] * 2
    assert new_branch[:2] == old_branch[:2] and new_branch[2] == ("user", "second question, reworded")
    assert second.locator(".version-count").inner_text() == "2/2"

    page.reload()
    assert conversation(page) == new_branch, "stored as shown"
    second = page.locator("article.user").nth(1)
    with page.expect_navigation():
        second.get_by_role("button", name="Previous version").click()
    assert conversation(page) == old_branch, "the old branch, whole"
    assert second.locator(".version-count").inner_text() == "1/2"
    page.reload()
    assert conversation(page) == old_branch, "the switch is stored"
    with page.expect_navigation():
        page.locator("article.user").nth(1).get_by_role("button", name="Next version").click()
    assert conversation(page) == new_branch, "and back: the new branch, whole"

    # The model continues the branch shown: a message on the old branch is answered after "third question".
    with page.expect_navigation():
        page.locator("article.user").nth(1).get_by_role("button", name="Previous version").click()
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.click("#settings summary")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "5")
    page.fill("#input", "fourth question")
    page.click("#send")
    answered(page, 4)
    assert conversation(page)[:6] == old_branch
    assert page.locator("article.user").nth(3).get_attribute("data-message-id"), "a new message is editable at once"
