"""A Celery worker reads its settings once, as a WorkerSettings: a worker built with values of its own
names its queue, control channel and heartbeat from them, whatever Django's settings say."""

from __future__ import annotations

from engine import EngineConfig
from workbench.celery import app
from workbench.serving.celery.worker import WorkerHost
from workbench.serving.celery.worker_settings import WorkerSettings


def worker_settings(**overrides) -> WorkerSettings:
    values = dict(redis_url="redis://127.0.0.1:1/0", queue_prefix="own-prefix", heartbeat_s=0.5,
                  lost_after_s=2.0, drain_s=1.0, capacity=7, stream_interval=1, stream_gap_s=0.0)
    return WorkerSettings(**(values | overrides))


def test_a_worker_built_with_its_own_settings_uses_them_not_djangos(settings):
    settings.WORKBENCH_QUEUE_PREFIX, settings.WORKBENCH_WORKER_CAPACITY = "django-prefix", 256
    host = WorkerHost("w1", EngineConfig(model="demo"), app, worker_settings())
    assert host.queue == "own-prefix.w1"
    assert host.control_channel == "own-prefix.control.w1"
    assert host._compose_heartbeat().capacity == 7


def test_from_django_reads_the_settings_of_the_moment(settings):
    settings.WORKBENCH_QUEUE_PREFIX, settings.WORKBENCH_DRAIN_S = "read-now", 3.5
    read = WorkerSettings.from_django()
    assert (read.queue_prefix, read.drain_s) == ("read-now", 3.5)
