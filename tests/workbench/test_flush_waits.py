"""A transactional test's flush waits for a write another thread still holds (flush_waits.py), and names
that thread; the flush as Django has it fails on the same hold, so the hold does collide."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from django.db import connection, transaction
from django.test import TransactionTestCase

from workbench.ops.models import LeakEvent

pytestmark = pytest.mark.django_db(transaction=True)


class Flushing(TransactionTestCase):
    databases = {"default"}


django_flush = getattr(TransactionTestCase._fixture_teardown, "__wrapped__", TransactionTestCase._fixture_teardown)


def holding_a_write(seconds: float) -> threading.Thread:
    """A thread named "holder" inside a write transaction for `seconds`, started once it holds it."""
    holds = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                LeakEvent.objects.create(worker="w", engine_run="r", number=1, kind="foreign", message="m",
                                         dropped=1, occurred_at=datetime.now(timezone.utc))
                holds.set()
                threading.Event().wait(seconds)
        finally:
            holds.set()
            connection.close()

    thread = threading.Thread(target=hold, name="holder", daemon=True)
    thread.start()
    assert holds.wait(10)
    return thread


def test_the_flush_waits_for_a_write_that_another_thread_holds_and_names_it(django_user_model):
    django_user_model.objects.create_user("left-behind", password="pw-left-123")
    holder = holding_a_write(0.5)
    with pytest.warns(UserWarning, match=r"holder at test_flush_waits\.py:\d+ \(hold\)"):
        Flushing()._fixture_teardown()  # as conftest.py installs it
    holder.join(10)
    assert (django_user_model.objects.count(), LeakEvent.objects.count()) == (0, 0)


def test_the_flush_alone_fails_on_the_same_hold():
    holder = holding_a_write(0.5)
    with pytest.raises(Exception, match="couldn't be flushed"):
        django_flush(Flushing())
    holder.join(10)
