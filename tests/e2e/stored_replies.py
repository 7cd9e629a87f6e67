"""Put a question and a reply of our choosing into a running server's conversation, as if the model had
written it: the page then renders it through the same path as any stored reply (the template, then
static/chat/markdown.js). Written straight into the server's SQLite file, which is what the server
reads; the demo model cannot be made to write a given table or a hostile link."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path


def store_exchange(db_path: Path, conversation_id: int, question: str, reply: str) -> None:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    with sqlite3.connect(db_path) as db:
        asked = db.execute("INSERT INTO chat_message (conversation_id, role, content, created_at, finish_reason,"
                           " error, shown, reply_to_id) VALUES (?, 'user', ?, ?, '', '', 1, NULL)",
                           (conversation_id, question, now.isoformat(" "))).lastrowid
        # The reply names the message it answers, as Conversation.add_reply does (its versions hang on it).
        db.execute("INSERT INTO chat_message (conversation_id, role, content, created_at, finish_reason, error,"
                   " shown, reply_to_id) VALUES (?, 'assistant', ?, ?, 'stop', '', 1, ?)",
                   (conversation_id, reply, (now + timedelta(milliseconds=1)).isoformat(" "), asked))
        db.execute("UPDATE chat_conversation SET title = ? WHERE id = ?", (question[:60], conversation_id))
    db.close()
