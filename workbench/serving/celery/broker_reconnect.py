"""A worker's Celery consumer that tries Redis again every second while it cannot reach it.

Celery's consumer reconnects through kombu's `ensure_connection` with kombu's defaults: the first retry
after 2 s, each next one 2 s later than the last, up to 30 s apart, and Celery has no setting for them.
So a worker whose Redis was away for a minute could sit up to half a minute longer without taking
requests after Redis came back, while the web side already routed to it again (its heartbeat thread is
back at once). A connection attempt to a stopped Redis is refused at once (to a host that does not answer,
it gives up after `broker_connection_timeout`), so one a second costs nothing. Celery's limit on the number
of tries (100 by default, at these pauses under two minutes) is lifted in the app's settings: a worker
that gave up would exit and reload its model when restarted.
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection

RETRY_S = 1  # seconds (an int: kombu types its pauses so)


class Consumer(CeleryConsumer):
    """Named by the app's `worker_consumer` setting (workbench/celery.py)."""

    def ensure_connected(self, conn: Connection) -> Connection:
        # Celery passes only the error callback, the retry limit and its shutdown check; the pauses are
        # the keyword arguments it leaves at kombu's defaults.
        retry = functools.partial(conn.ensure_connection, interval_start=RETRY_S, interval_step=0,
                                  interval_max=RETRY_S)
        conn.ensure_connection = retry  # type: ignore[method-assign]
        return super().ensure_connected(conn)
