"""The Celery task: admit requests into this worker's engine (their outputs travel on the channel layer)."""

from __future__ import annotations

from celery import shared_task

from workbench.serving.celery import wire


from workbench.serving.celery import worker
@shared_task(name=wire.GENERATE_TASK, ignore_result=True)
def generate(requests: list[dict], reply_channel: str) -> None:
    """Admit each request (request_id, prompt, params, user, model), in order: requests that reached the web
    process together travel in one task."""
    worker.host().admit(requests, reply_channel)
