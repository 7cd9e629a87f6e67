"""An operator's cancel of any request, from the dashboard socket (consumers.py): who may (staff), what
a cancel names (a worker and the request id the dashboard shows there), and the cancel itself: logged
first (RequestCancel), then sent, its outcome kept as the engine that held the request answered it. The
request ends as a client's cancel ends it, finish_reason "canceled"; its owner is recorded as the
dashboard showed them."""

from __future__ import annotations

from workbench.ops.models import RequestCancel
from workbench.serving.transport import Transport


def refusal(user) -> str | None:
    """Why `user` may not cancel others' requests, or None if they may (staff, active, signed in)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return "sign in first"
    if not user.is_staff:
        return "operators only (staff)"
    return None


def parse(frame: dict[str, object]) -> tuple[str, str]:
    """(worker, request_id) of a cancel frame; ValueError names the field that is wrong."""
    worker, request_id = frame.get("worker"), frame.get("request_id")
    if not isinstance(worker, str) or not worker or len(worker) > 128:
        raise ValueError("worker must be the id of the worker that holds the request, as the dashboard shows it")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 256:
        raise ValueError("request_id must be the request's id, as the dashboard shows it")
    return worker, request_id


def owner_of(transport: Transport, worker: str, request_id: str) -> str:
    """Whom the request serves, as the dashboard shows it (empty when it does not show it)."""
    view = transport.workers_view().get(worker)
    sequences = view["state"].get("sequences") if view is not None else None
    for sequence in sequences if isinstance(sequences, list) else []:
        if isinstance(sequence, dict) and sequence.get("request_id") == request_id:
            return str(sequence.get("user") or "")
    return ""


async def make(transport: Transport, user, worker: str, request_id: str) -> dict[str, object]:
    """Cancel the request and answer {"cancel": audit row id, "error": None once the engine has canceled
    it, or why it did not (no such request, it had already finished, no answer)}."""
    # Logged before it is sent: a cancel whose operator went away mid-way is still on the record.
    record = await RequestCancel.objects.acreate(user=user, worker=worker, request_id=request_id,
                                                 owner=owner_of(transport, worker, request_id))
    error = await transport.cancel_as_operator(worker, request_id)
    if error is not None:
        record.error = error
        await record.asave(update_fields=["error"])
    return {"cancel": record.pk, "error": error}
