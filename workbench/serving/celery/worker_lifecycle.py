"""A Celery worker's lifecycle, hooked to Celery's worker signals: it insists on a solo pool, takes its own
queue, starts its engine once the worker is ready (exiting if it cannot), stops taking work when asked
to shut down, and drains before it goes. The app (workbench/celery.py) includes this module by name, so
only worker processes import it."""

from __future__ import annotations

import logging
import os

from celery import signals

from workbench.serving import heap
from workbench.serving.celery import worker


@signals.celeryd_after_setup.connect
def _worker_identity(sender, instance, **kwargs) -> None:
    pool = getattr(instance.pool_cls, "__module__", str(instance.pool_cls))
    if not pool.endswith(("solo", "thread")):
        raise SystemExit(f"the workbench worker needs --pool solo (one engine per process), not {pool}")
    host = worker.prepare_host(instance.app)
    queues = instance.app.amqp.queues
    queues.select_add(host.queue)
    queues.deselect(instance.app.conf.task_default_queue)  # only its own queue: the web side routes


@signals.worker_ready.connect
def _worker_engine(sender, **kwargs) -> None:
    heap.serving_process()  # the engine host freezes the engine's objects too once it has loaded
    try:
        worker.host().start()
    except BaseException:
        # Celery would log this and go on as a worker without an engine; exit, so whatever supervises
        # the worker sees it fail (it never published a heartbeat, so nothing was routed to it).
        logging.getLogger(__name__).critical("the worker's engine failed to start", exc_info=True)
        os._exit(3)


@signals.worker_shutting_down.connect
def _worker_stops_taking(sig, how, exitcode, **kwargs) -> None:
    worker.begin_drain()


@signals.worker_shutdown.connect
def _worker_drain(sender, **kwargs) -> None:
    worker.stop_host()
