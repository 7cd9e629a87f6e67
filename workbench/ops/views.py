"""The runtime flags over HTTP, for operators: GET lists every registered flag with its state on each
worker; POST changes one, on one worker or all, and records the change and every worker's answer in
the audit log (FlagChange). Staff with the `ops.flip_flags` permission only; others get 403.
"""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse

from engine.capabilities import REGISTRY, UnknownFlag, checked_value
from workbench.ops.models import FlagChange
from workbench.serving import bridge


def _refusal(user) -> JsonResponse | None:
    if not user.is_authenticated:
        return JsonResponse({"error": "sign in first"}, status=403)
    if not (user.is_staff and user.has_perm("ops.flip_flags")):
        return JsonResponse({"error": "operators only (staff with the ops.flip_flags permission)"}, status=403)
    return None


async def flags(request: HttpRequest) -> JsonResponse:
    user = await request.auser()
    refusal = await sync_to_async(_refusal)(user)
    if refusal is not None:
        return refusal
    transport = await asyncio.to_thread(bridge.transport)
    if request.method == "GET":
        return JsonResponse(_listing(transport))
    if request.method != "POST":
        return JsonResponse({"error": "use GET or POST"}, status=405)
    try:
        name, value, worker = _change(request.body)
    except (ValueError, UnknownFlag) as exc:
        return JsonResponse({"error": str(exc).strip("'\"")}, status=400)
    # Logged before it is sent: a change whose asker went away mid-way is still on the record.
    change = await FlagChange.objects.acreate(user=user, name=name, value=value, all_workers=worker is None,
                                              workers=[worker] if worker else [])
    answers = await transport.change_flag(name, value, None if worker is None else [worker])
    change.workers, change.answers = sorted(answers), answers
    await change.asave(update_fields=["workers", "answers"])
    return JsonResponse({"change": change.pk, "answers": answers})


def _listing(transport) -> dict:
    in_force = transport.flags_in_force()
    return {"flags": [{"name": entry.name, "description": entry.description, "kind": entry.kind,
                       "settable": entry.settable, "default": entry.default,
                       "in_force": {worker: flags.get(entry.name) for worker, flags in in_force.items()}}
                      for entry in REGISTRY]}


def _change(body: bytes) -> tuple[str, bool | int, str | None]:
    try:
        change = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the body must be JSON: {\"name\", \"value\", \"worker\" (optional: all)}") from None
    if not isinstance(change, dict):
        raise ValueError("the body must be a JSON object")
    name, value = change.get("name"), checked_value(change.get("name"), change.get("value"))
    worker = change.get("worker")
    if worker is not None and not isinstance(worker, str):
        raise ValueError("worker must be a worker id (or left out for every worker)")
    return name, value, worker
