"""Operators' pages over HTTP: the runtime flags (GET lists every registered flag with its state on each
worker; POST changes one, on one worker or all, recorded in the audit log), and the live dashboard page
(its data comes over the socket, workbench/ops/consumers.py). Staff only; flag changes need the
`ops.flip_flags` permission too.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from engine.host.capabilities import UnknownFlag
from workbench.ops import flag_changes
from workbench.protocol.json_input import JsonInputError, parse_object
from workbench.serving import bridge


async def flags(request: HttpRequest) -> JsonResponse:
    user = await request.auser()
    refusal = await sync_to_async(flag_changes.refusal)(user)
    if refusal is not None:
        return JsonResponse({"error": refusal}, status=403)
    transport = await bridge.transport_from_loop()
    if request.method == "GET":
        return JsonResponse({"flags": flag_changes.listing(transport)})
    if request.method != "POST":
        return JsonResponse({"error": "use GET or POST"}, status=405)
    try:
        body = parse_object(request.body, "the body")
    except JsonInputError as exc:
        return JsonResponse({"error": f"{exc.message}; send {{\"name\", \"value\", \"worker\" (optional: all)}}"},
                            status=400)
    try:
        name, value, worker = flag_changes.parse(body)
    except (ValueError, UnknownFlag) as exc:
        return JsonResponse({"error": str(exc).strip("'\"")}, status=400)
    return JsonResponse(await flag_changes.make(transport, user, name, value, worker))


def dashboard(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not request.user.is_staff:
        return render(request, "ops/forbidden.html", status=403)
    return render(request, "ops/dashboard.html",
                  {"may_flip": flag_changes.refusal(request.user) is None})
