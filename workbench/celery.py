"""The Celery app: `celery -A workbench worker --pool solo` starts a GPU worker (docs/OPERATIONS.md).

Why these settings (the full reasoning is in docs/OPERATIONS.md):
- The task only admits requests into the worker's engine and returns in milliseconds; the engine
  batches everything it holds. So one solo pool per process (one engine per GPU), no prefork.
- Early acks (acks_late off): a task is acknowledged when received, so a worker that dies never has
  its tasks redelivered to another; a lost worker is detected by its heartbeat instead, and its
  clients get an error. A request therefore never runs twice (and `admit_once` refuses any that would).
- Each worker consumes only its own queue, named with a per-start id: the web side routes a request
  to a live worker it chose, and a restarted worker never picks up its predecessor's leftovers.
- A worker that lost Redis tries it again every second, for as long as it takes (Celery's consumer
  backs off to 30 s between tries and gives up after 100): workbench/serving/celery/broker_reconnect.py.
- No result backend and no remote control: results travel on the channel layer, and the heartbeat in
  Redis is the presence signal. Start workers with --without-mingle --without-gossip too (as
  `make stack` and docker-compose.yml do): Celery has no setting for those two.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")

from django.conf import settings  # noqa: E402  (settings module chosen first)

# Imported by name when a worker starts (before its setup signals), never by the web side: the worker's
# task and its lifecycle live with the rest of the worker, in workbench/serving/celery/.
app = Celery("workbench", include=["workbench.serving.celery.tasks", "workbench.serving.celery.worker_lifecycle"])
app.conf.update(
    broker_url=settings.REDIS_URL,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_consumer="workbench.serving.celery.broker_reconnect:Consumer",
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
