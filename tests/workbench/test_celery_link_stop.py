"""Stopping the Celery transport's link thread leaves no task pending on its loop.

A task still pending when the loop closes is destroyed later, wherever the garbage collector happens
to run, with an error in that code's log: in the suite it failed an unrelated test that checked its
own log was empty. stop() cancels the tasks it knows of; the link thread runs out any others before it
closes the loop. Runs against the machine's Redis, with no worker.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid

from django.conf import settings

from workbench.serving.celery.link_settings import LinkSettings
from workbench.serving.celery.transport import CeleryTransport


def test_a_task_stop_does_not_know_of_is_run_out_before_the_loop_closes(caplog):
    transport = CeleryTransport(LinkSettings(model=settings.WORKBENCH_MODEL, redis_url=settings.REDIS_URL,
                                             queue_prefix=f"link-stop-{uuid.uuid4().hex[:8]}", heartbeat_s=0.5,
                                             lost_after_s=2.0))
    transport.start()
    stray = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), transport._loop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        transport.stop()
        assert not transport._thread.is_alive()
        del transport
        gc.collect()
    assert stray.cancelled(), "the stray task was not run out: it was left pending at close"
    destroyed = [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert not destroyed, destroyed
