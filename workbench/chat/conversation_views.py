"""Managing a conversation from the page: rename, delete, export (Markdown, JSON), which version of a
reply is shown, and its settings (system prompt, sampling) saved for it or as the user's default.

Each is reached only by the conversation's owner: anyone else gets 404, as for the conversation page
(its existence is private too). The changes are POSTs under Django's CSRF check: forms carry the
token, the page's fetch() sends it as X-CSRFToken. Bad input is a 400 naming the field:
{"error": {"code", "message", "param"}}.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from workbench.chat import export, preferences, versions
from workbench.chat.models import ChatDefaults, Conversation, Message, ReplyUnderWay
from workbench.chat.stored_text import nul_refusal
from workbench.chat.titles import MAX_RENAME_CHARS
from workbench.protocol.json_input import JsonInputError, parse_object
from workbench.protocol.request_input import InvalidInput


def _owned(request: HttpRequest, conversation_id: int) -> Conversation:
    return get_object_or_404(Conversation.owned_by(request.user), pk=conversation_id)


def _refused(exc: InvalidInput) -> JsonResponse:
    return JsonResponse({"error": {"code": exc.code, "message": exc.message, "param": exc.param}}, status=400)


@login_required
@require_POST
def rename(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    title = " ".join(request.POST.get("title", "").split())  # one line: it is shown as one
    if not title or len(title) > MAX_RENAME_CHARS:
        return _refused(InvalidInput("invalid_request", f"title: must be 1-{MAX_RENAME_CHARS} characters",
                                     "title"))
    if (refusal := nul_refusal("title", title)) is not None:
        return _refused(InvalidInput("invalid_request", refusal, "title"))
    conversation.title = title
    conversation.save(update_fields=["title"])
    return redirect("conversation", conversation.pk)


@login_required
@require_POST
def delete(request: HttpRequest, conversation_id: int) -> HttpResponse:
    # The page asks for a confirmation first (static/chat/conversations.js); a reply under way ends
    # with "conversation_gone" on its socket (workbench/chat/consumers.py).
    _owned(request, conversation_id).delete()
    return redirect("conversations")


@login_required
@require_GET
def export_markdown(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    return _download(export.as_markdown(conversation), "text/markdown; charset=utf-8",
                     export.filename(conversation, "md"))


@login_required
@require_GET
def export_json(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    return _download(export.as_json(conversation), "application/json", export.filename(conversation, "json"))


def _download(body: str, content_type: str, name: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _checked_body(request: HttpRequest) -> tuple[str, dict[str, object]]:
    try:  # lone surrogates refused too: no database can store them
        body = parse_object(request.body, "the body")
    except JsonInputError as exc:
        raise InvalidInput("invalid_request", f"the body must be a JSON object of text: {exc.message}",
                           "body") from None
    return preferences.checked(body)


@login_required
@require_POST
def save_settings(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """This conversation's system prompt and sampling settings, as the page shows them."""
    conversation = _owned(request, conversation_id)
    try:
        conversation.system_prompt, conversation.sampling = _checked_body(request)
    except InvalidInput as exc:
        return _refused(exc)
    conversation.save(update_fields=["system_prompt", "sampling"])
    return JsonResponse({"system_prompt": conversation.system_prompt, "sampling": conversation.sampling})


@login_required
@require_POST
def save_defaults(request: HttpRequest) -> HttpResponse:
    """The user's default system prompt and sampling settings, for the conversations they start next."""
    try:
        system_prompt, sampling = _checked_body(request)
    except InvalidInput as exc:
        return _refused(exc)
    assert isinstance(request.user, User)  # login_required let no anonymous user in
    ChatDefaults.objects.update_or_create(user=request.user,
                                          defaults={"system_prompt": system_prompt, "sampling": sampling})
    return JsonResponse({"system_prompt": system_prompt, "sampling": sampling})


@login_required
@require_POST
def show_version(request: HttpRequest, conversation_id: int, message_id: int) -> HttpResponse:
    """Show this version of its reply (the page's < and > buttons), then the conversation again."""
    conversation = _owned(request, conversation_id)
    try:
        versions.show(conversation, message_id)
    except Message.DoesNotExist:
        return _refused(InvalidInput("invalid_request", "message: no reply of this conversation", "message"))
    except ReplyUnderWay:
        return JsonResponse({"error": {"code": "busy", "message": "a reply is being generated; wait for it or stop it",
                                       "param": None}}, status=409)
    return redirect("conversation", conversation.pk)
