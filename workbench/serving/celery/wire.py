"""What travels between web processes and Celery workers, and on what.

- Requests: a Celery task (`workbench.generate`) on the chosen worker's own queue, `<prefix>.<worker id>`,
  carrying the requests for that worker that reached the web process while the previous task was on its way.
- Tokens back: `events` messages on the channels-redis layer, sent to the web process's reply channel;
  each carries every pending delta of that web process's requests on that worker (coalesced), and each
  delta says at which token offset it starts, so the web side can tell a gap from a late delta.
- Cancel: a `cancel` message on the worker's control channel, `<prefix>.control.<worker id>`. Celery's
  revoke cannot stop a task that already runs, and our task only admits; the engine holds the request.
  An operator's cancel names an ask id and the asking web process's reply channel; the worker answers
  `cancel_done` there once its engine has applied it, saying whether the engine still held the request.
- Runtime flags: a `set_flag` message on the control channel; the worker answers `flag_done` (the flags
  in force after its next step boundary, or why it refused) on the asking web process's reply channel.
  Changes meant for every worker are also kept in the Redis hash `<prefix>:flags`, which a worker
  applies when it starts.

The channel layer these travel on is redis_layer.py's (channels-redis with a faster send and receive).
"""

from __future__ import annotations

from workbench.serving.streams import StreamEvent

GENERATE_TASK = "workbench.generate"
EVENTS = "workbench.events"
CANCEL = "workbench.cancel"
AUDIT_PICK = "workbench.audit_pick"
CANCEL_DONE = "workbench.cancel_done"
SET_FLAG = "workbench.set_flag"
FLAG_DONE = "workbench.flag_done"
# A task not started within this long is dropped by Celery unrun: its client has had an error by then.
TASK_EXPIRES_S = 60


# `prefix` below is WORKBENCH_QUEUE_PREFIX, which both sides take from their settings (LinkSettings,
# WorkerSettings): the deployment's namespace in Redis.

def queue_name(prefix: str, worker_id: str) -> str:
    return f"{prefix}.{worker_id}"


def control_channel(prefix: str, worker_id: str) -> str:
    name = f"{prefix}.control.{worker_id}"
    if len(name) >= 100:  # Channels refuses longer names on every send and receive
        raise ValueError(f"channel name {name!r} is too long; shorten WORKBENCH_QUEUE_PREFIX")
    return name


def events_message(events: dict[str, StreamEvent]) -> dict:
    return {"type": EVENTS, "events": [{"request_id": rid, **event.as_message()} for rid, event in events.items()]}


def events_of(message: dict) -> list[tuple[str, StreamEvent]]:
    return [(item["request_id"], StreamEvent.from_message(item)) for item in message.get("events", [])]


def cancel_message(request_id: str) -> dict:
    return {"type": CANCEL, "request_id": request_id, "by_operator": False}


def operator_cancel_message(request_id: str, ask_id: str, reply_channel: str) -> dict:
    return {"type": CANCEL, "request_id": request_id, "by_operator": True, "ask_id": ask_id,
            "reply_channel": reply_channel}


def cancel_done_message(ask_id: object, held: bool) -> dict:
    """`ask_id`: the asking message's, echoed as it came."""
    return {"type": CANCEL_DONE, "ask_id": ask_id, "held": held}


def audit_pick_message(request_id: str) -> dict:
    return {"type": AUDIT_PICK, "request_id": request_id}


def flags_key(prefix: str) -> str:
    return f"{prefix}:flags"


def set_flag_message(change_id: str, name: str, value: bool | int, reply_channel: str) -> dict:
    return {"type": SET_FLAG, "change_id": change_id, "name": name, "value": value, "reply_channel": reply_channel}


def flag_done_message(change_id: object, worker_id: str, in_force: dict | None, error: str | None) -> dict:
    """`change_id`: the asking message's, echoed as it came (a garbled one is answered too)."""
    return {"type": FLAG_DONE, "change_id": change_id, "worker_id": worker_id, "in_force": in_force, "error": error}
