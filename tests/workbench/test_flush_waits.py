"""A transactional test's flush waits for a write another thread still holds (flush_waits.py), and names
that thread; the flush as Django has it fails on the same hold, so the hold does collide."""

from __future__ import annotations

import inspect
import threading
import time
from datetime import datetime, timezone

import pytest
from django.db import connection, transaction
from django.test import TransactionTestCase

from tests.workbench.flush_waits import waiting_for_other_writers
from workbench.ops.models import LeakEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_sqlite():
    """Known once the test database is set up: only the in-memory SQLite one refuses a second writer at once."""
    if not (connection.vendor == "sqlite" and connection.is_in_memory_db()):
        pytest.skip("a file or PostgreSQL database makes the flush wait for the writer by itself")


def holding_a_write(release: threading.Event) -> threading.Thread:
    """A thread named "holder" inside a write transaction until `release` is set, started once it holds it."""
    held = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            LeakEvent.objects.create(worker="w", engine_run="r", number=1, kind="foreign", message="m",
                                     dropped=1, occurred_at=datetime.now(timezone.utc))
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold, name="holder", daemon=True)
    thread.start()
    assert held.wait(10), "the holder could not write"
    return thread


def test_the_flush_waits_for_a_write_that_another_thread_holds_and_names_it(django_user_model):
    assert TransactionTestCase._fixture_teardown.__code__.co_name == "flush_when_free", "conftest.py installs the wrapper"
    django_user_model.objects.create_user("left-behind", password="pw-left-123")
    release = threading.Event()
    holder = holding_a_write(release)
    flush = waiting_for_other_writers(inspect.unwrap(TransactionTestCase._fixture_teardown),
                                      pause=lambda s: (release.set(), time.sleep(s)))  # the hold ends at the first retry
    with pytest.warns(UserWarning, match=r"waited .* holder at test_flush_waits\.py:\d+ \(hold\)"):
        flush(TransactionTestCase())
    holder.join(10)
    assert not holder.is_alive()
    assert (django_user_model.objects.count(), LeakEvent.objects.count()) == (0, 0)


def test_the_flush_alone_fails_on_the_same_hold():
    release = threading.Event()
    holder = holding_a_write(release)
    try:
        with pytest.raises(Exception, match="couldn't be flushed"):
            inspect.unwrap(TransactionTestCase._fixture_teardown)(TransactionTestCase())
    finally:
        release.set()
    holder.join(10)
    assert not holder.is_alive()
