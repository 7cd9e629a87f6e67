"""POST /v1/reproduce/{id}: re-derive one of the caller's own recent API requests and compare the bits.

`id` is what the API answered with: an OpenAI reply's `id` (its choice i > 0: `{id}-{i}`). A record
older than WORKBENCH_REPRODUCE_RETENTION_S, never kept, or kept for another user is the same 404, so
an id says nothing about anyone else's requests. docs/PROTOCOL.md, "Reproduce", has the answer's shape.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from workbench.api import reproduce_records
from workbench.api.http_api import ERROR_STATUS, ApiError, authenticate
from workbench.serving import limits, served_models
from workbench.serving.rederive import RederiveFailed, rederive


@csrf_exempt
async def reproduce(request: HttpRequest, request_id: str) -> HttpResponseBase:
    try:
        if request.method != "POST":
            raise ApiError(405, "use POST")
        user = await authenticate(request)
        kept = await reproduce_records.record_of(user, request_id)
        if kept is None:
            raise ApiError(404, f"no reproducibility record {request_id!r} of yours (kept for "
                                "WORKBENCH_REPRODUCE_RETENTION_S)", code="not_found")
        try:
            answer = await rederive(user.get_username(), kept.record, kept.model)
        except limits.Refused as exc:
            raise ApiError.limit(exc) from None
        except served_models.TokenizerUnreadable as exc:
            raise ApiError(503, exc.message, code="unavailable") from None
        except RederiveFailed as exc:
            status = 409 if exc.code == "no_record" else ERROR_STATUS.get(exc.code, 500)
            raise ApiError(status, exc.message, code=exc.code) from None
        return JsonResponse({"id": request_id, "object": "reproduction", **answer})
    except ApiError as exc:
        return exc.response()
