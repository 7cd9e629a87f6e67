"""The Celery task: admit one request into this worker's engine (its outputs travel on the channel layer)."""

from __future__ import annotations

from celery import shared_task

from workbench.serving import wire, worker


@shared_task(name=wire.GENERATE_TASK, ignore_result=True)
def generate(request_id: str, prompt: str | list[int], params: dict, reply_channel: str, user: str = "") -> None:
    worker.host().admit(request_id, prompt, params, reply_channel, user)
