"""Regenerate docs/screenshots/: the conversation list and a chat with a code reply, 1280 and 375 px
wide, light and dark, as Debian's chromium shows them (the README shows them).

    .venv/bin/python -m scripts.screenshots [--out docs/screenshots]

Starts its own Daphne (the in-process engine, a throwaway SQLite file), signs up a user, stores a few
conversations with replies written here (tests/e2e/stored_replies.py: the pictures show the same text
on every run, whatever the model would say), and shoots each page in a browser context whose system
colour scheme is light or dark: the pages follow prefers-color-scheme, as a visitor's would. Every time
the pages show is set to a fixed clock (CLOCK) first, so a run on an unchanged page gives the same
pictures byte for byte and `git status` shows only the pages that changed.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import sqlite3
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.cluster import ROOT, start_daphne
from tests.e2e.stored_replies import store_exchange

USER, PASSWORD = "ada", "a-long-pass-9!"
CLOCK = datetime(2026, 1, 5, 9, 30)  # when the pictures' conversations were "written" (UTC, as stored)
WIDTHS = {1280: 800, 375: 740}  # width -> height of the shot (the viewport, not the whole page)
CODE_REPLY = """Here is a function that reads a file's lines, skipping blank ones:

```python
from pathlib import Path


def lines(path: str) -> list[str]:
    \"\"\"The file's non-blank lines, stripped.\"\"\"
    text = Path(path).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]
```

| call | returns |
|------|---------|
| `lines("notes.txt")` | every non-blank line |
| `lines("empty.txt")` | `[]` |

- It reads the whole file at once: fine for small files.
- For big ones, iterate over the open file instead.
"""
CONVERSATIONS = [
    ("Plan a three-day trip to Lisbon", "Day 1: Alfama and the castle. Day 2: Belém. Day 3: Sintra."),
    ("Explain the KV cache in one paragraph", "Each layer keeps the keys and values of past tokens, so a new "
     "token attends to them without recomputing them."),
    ("Read a file's lines in Python", CODE_REPLY),
]


def sign_up(browser: Browser, base: str) -> tuple[BrowserContext, Page]:
    """A context signed in as the new user (its cookies go on to every shot's context) and its page."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{base}/signup")
    page.fill("#id_username", USER)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return context, page


def set_clock(db: Path) -> None:
    """Give every conversation and message a time from CLOCK on, a few minutes apart in the order they
    were made, in place of the real times of this run (the conversation list shows them)."""
    with sqlite3.connect(db) as connection:
        for table in ("chat_conversation", "chat_message"):
            ids = [row[0] for row in connection.execute(f"SELECT id FROM {table} ORDER BY id")]
            for n, row_id in enumerate(ids):
                at = (CLOCK + timedelta(minutes=7 * n)).isoformat(" ")
                columns = "created_at = ?, updated_at = ?" if table == "chat_conversation" else "created_at = ?"
                connection.execute(f"UPDATE {table} SET {columns} WHERE id = ?",
                                   (at, at, row_id) if table == "chat_conversation" else (at, row_id))
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (make chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "db.sqlite3"
        # A throwaway key for a throwaway server (Daphne refuses the public development key).
        env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess", "WORKBENCH_SECRET_KEY": secrets.token_urlsafe(50)}
        server, address, _ = start_daphne(env, db)
        base = f"http://{address}"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium,
                                            args=["--headless", "--no-sandbox", "--disable-gpu"])
                context, page = sign_up(browser, base)
                chat_url = ""
                for question, reply in CONVERSATIONS:
                    page.goto(f"{base}/")
                    page.click("#new-conversation")
                    page.wait_for_url(re.compile(r".*/c/\d+$"))
                    chat_url = page.url
                    store_exchange(db, int(chat_url.rsplit("/", 1)[1]), question, reply)
                set_clock(db)
                state = context.storage_state()
                context.close()
                for theme in ("light", "dark"):
                    for width, height in WIDTHS.items():
                        shot = browser.new_context(storage_state=state, color_scheme=theme,
                                                   viewport={"width": width, "height": height})
                        page = shot.new_page()
                        for name, url in (("conversations", f"{base}/"), ("chat", chat_url)):
                            page.goto(url)
                            page.wait_for_load_state("networkidle")
                            if name == "chat":  # connected: the composer's buttons as a user sees them
                                page.wait_for_selector("#send:not([disabled])")
                            path = args.out / f"{name}-{width}-{theme}.png"
                            page.screenshot(path=str(path))
                            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path  # --out may be elsewhere
                            print(f"{shown}  {path.stat().st_size // 1024} KiB")
                        shot.close()
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
