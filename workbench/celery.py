"""The Celery app: `celery -A workbench worker --pool solo` starts a GPU worker (docs/OPERATIONS.md).

Why these settings (the full reasoning is in docs/OPERATIONS.md):
- The task only admits requests into the worker's engine and returns in milliseconds; the engine
  batches everything it holds. So one solo pool per process (one engine per GPU), no prefork.
- Early acks (acks_late off): a task is acknowledged when received, so a worker that dies never has
  its tasks redelivered to another; a lost worker is detected by its heartbeat instead, and its
  clients get an error. A request therefore never runs twice (and `admit_once` refuses any that would).
- Each worker consumes only its own queue, named with a per-start id: the web side routes a request
  to a live worker it chose, and a restarted worker never picks up its predecessor's leftovers.
- No result backend and no remote control: results travel on the channel layer, and the heartbeat in
  Redis is the presence signal. Start workers with --without-mingle --without-gossip too (as
  `make stack` and docker-compose.yml do): Celery has no setting for those two.
"""

from __future__ import annotations

import logging
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")

from django.conf import settings  # noqa: E402  (settings module chosen first)

app = Celery("workbench", include=["workbench.serving.celery.tasks"])
app.conf.update(
    broker_url=settings.REDIS_URL,
    broker_connection_retry_on_startup=True,
    broker_connection_timeout=3,
    broker_transport_options={"socket_timeout": 5, "socket_connect_timeout": 3},
    task_acks_late=False,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    task_default_queue=f"{settings.WORKBENCH_QUEUE_PREFIX}.unrouted",
)


@signals.celeryd_after_setup.connect
def _worker_identity(sender, instance, **kwargs) -> None:
    from workbench.serving.celery import worker

    pool = getattr(instance.pool_cls, "__module__", str(instance.pool_cls))
    if not pool.endswith(("solo", "thread")):
        raise SystemExit(f"the workbench worker needs --pool solo (one engine per process), not {pool}")
    host = worker.prepare_host(instance.app)
    queues = instance.app.amqp.queues
    queues.select_add(host.queue)
    queues.deselect(instance.app.conf.task_default_queue)  # only its own queue: the web side routes


@signals.worker_ready.connect
def _worker_engine(sender, **kwargs) -> None:
    from workbench.serving.celery import worker

    try:
        worker.host().start()
    except BaseException:
        # Celery would log this and go on as a worker without an engine; exit, so whatever supervises
        # the worker sees it fail (it never published a heartbeat, so nothing was routed to it).
        logging.getLogger(__name__).critical("the worker's engine failed to start", exc_info=True)
        os._exit(3)


@signals.worker_shutting_down.connect
def _worker_stops_taking(sig, how, exitcode, **kwargs) -> None:
    from workbench.serving.celery import worker

    worker.begin_drain()


@signals.worker_shutdown.connect
def _worker_drain(sender, **kwargs) -> None:
    from workbench.serving.celery import worker

    worker.stop_host()
