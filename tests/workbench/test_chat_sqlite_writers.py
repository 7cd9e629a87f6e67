"""A chat turn on the default SQLite database while another connection writes: it waits its turn.

SQLite lets a transaction that began by reading wait for no writer: when it then writes while another
connection holds the write lock, it fails at once with "database is locked" (waiting could deadlock).
The chaos soak met it as an internal_error on a chat turn with four chat clients and sixteen API clients
on one SQLite file. A conversation's `lock()` therefore takes SQLite's write lock as its transaction's
first statement, where the busy timeout lets it wait.

A file database, as `make run` keeps one, in a process of its own (the suite's test database lives in
shared-cache memory, where SQLite's locks behave otherwise); a raw sqlite3 connection holds the write lock
for a second while the turn is taken.
"""

from __future__ import annotations

import os
import shutil

from tests.cluster import django_script, migrated_database

SCRIPT = """
import sqlite3, threading, time
from django.contrib.auth import get_user_model
from django.db import OperationalError, transaction
from workbench.chat.models import Conversation

user = get_user_model().objects.create(username="ann")
mine, other = (Conversation.objects.create(owner=user) for _ in range(2))
held = threading.Event()

def writer():
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
    db.execute("BEGIN IMMEDIATE")
    held.set()
    db.execute("UPDATE chat_conversation SET title = 'elsewhere' WHERE id = ?", (other.pk,))
    time.sleep(0.3)
    db.execute("COMMIT")

writers = []
def another_writer_arrives():
    held.clear()
    writers.append(threading.Thread(target=writer))
    writers[-1].start()
    held.wait(1.0)  # where this transaction holds the write lock, the writer waits for it instead

# The control: a transaction that has read when the other writer arrives cannot write.
try:
    with transaction.atomic():
        list(Conversation.objects.filter(pk=mine.pk))
        another_writer_arrives()
        Conversation.objects.filter(pk=mine.pk).update(title="read first")
    print("control: written")
except OperationalError as exc:
    print("control:", exc)
writers[-1].join()

# The turn, with the other writer arriving after the turn's transaction has begun (as it reads the branch).
real = Conversation.shown_messages
def shown_messages(self):
    another_writer_arrives()
    return real(self)
Conversation.shown_messages = shown_messages
try:
    history, claim = mine.take_turn("send", "hello")
    print("turn:", [m["content"] for m in history], mine.messages.count())
except OperationalError as exc:
    print("turn:", exc)
for thread in writers:
    thread.join()
"""


def test_a_chat_turn_waits_for_another_writer_on_a_sqlite_file(tmp_path) -> None:
    database = tmp_path / "db.sqlite3"
    shutil.copyfile(migrated_database(), database)
    out = django_script(dict(os.environ), database, SCRIPT, str(database)).splitlines()
    assert out[0] == "control: database is locked", out  # the hazard is real while the writer holds
    assert out[1] == "turn: ['hello'] 1", out
