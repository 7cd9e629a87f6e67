"""A stopping worker's queue deleted from Redis: its id is new at every start, so nothing will read it
again.

Deleted with kombu's bindings of it, which Redis would otherwise keep for every worker start ever (the
web side's publishes bind it to an exchange of its own name, the worker's consumer to the default
exchange), and with any task published in the moment before its web process saw the drain (that
client gets worker_lost).
"""

from __future__ import annotations

import logging

from celery import Celery

log = logging.getLogger(__name__)


def delete_queue(app: Celery, queue_name: str) -> None:
    queues = app.amqp.queues
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)  # Redis away: give up now, not retry for ever
            for queue in (queues[queue_name], queues.new_missing(queue_name)):
                bound = queue(connection.default_channel)
                bound.declare()  # kombu deletes the bindings its channel knows of: this one now does
                bound.delete()
    except Exception as exc:  # Redis away: the keys stay, as they do for a killed worker
        log.warning("could not delete queue %s: %s", queue_name, exc)
