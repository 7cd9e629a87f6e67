"""A runtime flag change as operators make it, over HTTP (views.py) or the dashboard socket (consumers.py):
who may, what a change looks like, and the change itself: logged first, sent, every worker's answer kept."""

from __future__ import annotations

from engine.host.capabilities import REGISTRY, capability, checked_value
from workbench.ops.models import FlagChange

FLIP_PERMISSION = "ops.flip_flags"


def refusal(user) -> str | None:
    """Why `user` may not change flags, or None if they may. Call where the database may be used."""
    if not user.is_authenticated:
        return "sign in first"
    if not (user.is_staff and user.has_perm(FLIP_PERMISSION)):
        return "operators only (staff with the ops.flip_flags permission)"
    return None


def parse(change: object) -> tuple[str, bool | int, str | None]:
    """(name, value, worker or None for all) from a JSON object; ValueError/UnknownFlag name what is wrong."""
    if not isinstance(change, dict):
        raise ValueError("a flag change is a JSON object: {\"name\", \"value\", \"worker\" (optional: all)}")
    name = capability(change.get("name")).name  # the registered name; UnknownFlag for any other
    value = checked_value(name, change.get("value"))
    worker = change.get("worker")
    if worker is not None and (not isinstance(worker, str) or not worker):
        raise ValueError("worker must be a worker id (or left out for every worker)")
    return name, value, worker


async def make(transport, user, name: str, value: bool | int, worker: str | None) -> dict:
    """Change one flag on one worker (or all) and answer {"change": audit row id, "answers": per worker}."""
    # Logged before it is sent: a change whose asker went away mid-way is still on the record.
    change = await FlagChange.objects.acreate(user=user, name=name, value=value, all_workers=worker is None,
                                              workers=[worker] if worker else [])
    answers = await transport.change_flag(name, value, None if worker is None else [worker])
    change.workers, change.answers = sorted(answers), answers
    await change.asave(update_fields=["workers", "answers"])
    return {"change": change.pk, "answers": answers}


def recent(limit: int = 10) -> list[dict]:
    """The latest changes from the audit log, newest first, for the dashboard."""
    return [{"id": c.pk, "at": c.created_at.isoformat(), "user": c.user.username, "name": c.name, "value": c.value,
             "workers": "all workers" if c.all_workers else ", ".join(c.workers), "refused_by": c.refused_by}
            for c in FlagChange.objects.select_related("user")[:limit]]


def listing(transport) -> list[dict]:
    """Every registry entry with its description and its value on each worker."""
    in_force = transport.flags_in_force()
    return [{"name": entry.name, "description": entry.description, "kind": entry.kind,
             "settable": entry.settable, "default": entry.default,
             "in_force": {worker: flags.get(entry.name) for worker, flags in in_force.items()}}
            for entry in REGISTRY]
