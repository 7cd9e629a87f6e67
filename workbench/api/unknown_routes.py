"""A path under /v1 or /api that no route serves, answered as a 404 with JSON (OpenAI's error shape under
/v1, which Anthropic's SDK reads too; Ollama's under /api): an API client gets a message it can show,
where Django's page would hand it HTML. Ollama clients ask for /api/embed and /api/pull, agents
for /v1/embeddings; none is served here, and the message says which routes are.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

V1_ROUTES = ("/v1/chat/completions, /v1/completions, /v1/models, /v1/models/{id}, /v1/messages, "
             "/v1/messages/count_tokens, /v1/responses, /v1/responses/{id}, /v1/reproduce/{id}")
OLLAMA_ROUTES = "/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version"


def _said(request: HttpRequest, routes: str) -> str:
    return f"{request.method} {request.path} is not served here (served: {routes})"


@csrf_exempt  # a POST's answer is this 404 as well, not the CSRF check's HTML 403
async def openai_not_found(request: HttpRequest, rest: str) -> JsonResponse:
    return JsonResponse({"error": {"message": _said(request, V1_ROUTES), "type": "invalid_request_error",
                                   "param": None, "code": "not_found"}}, status=404)


@csrf_exempt
async def ollama_not_found(request: HttpRequest, rest: str) -> JsonResponse:
    return JsonResponse({"error": _said(request, OLLAMA_ROUTES)}, status=404)
