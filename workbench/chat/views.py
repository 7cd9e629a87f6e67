"""The chat pages: the conversation list (and its search), a conversation, and the API-token page.
What the page changes in a conversation is in workbench/chat/conversation_views.py."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from workbench.api.models import ApiToken
from workbench.chat.models import Conversation
from workbench.chat.preferences import form_values
from workbench.chat import versions
from workbench.chat.search import search
from workbench.chat.stored_text import nul_refusal
from workbench.serving import served_models


@login_required
def conversations(request):
    if request.method == "POST":
        return redirect("conversation", Conversation.start(request.user).pk)
    query = request.GET.get("q", "").strip()
    return render(request, "chat/conversations.html", {
        "conversations": Conversation.owned_by(request.user), "query": query,
        "found": search(request.user, query) if query else None})


@login_required
def conversation(request, conversation_id: int):
    # Someone else's conversation is "not found", not "forbidden": its existence is private too.
    chat = get_object_or_404(Conversation.owned_by(request.user), pk=conversation_id)
    shown = versions.shown(chat)
    served = served_models.served()
    # The selector starts at the model of the last reply shown, while it is served: a conversation goes
    # on with the model it was having, until its owner picks another.
    last = next((s.message.model for s in reversed(shown) if s.message.role == "assistant" and s.message.model), "")
    return render(request, "chat/conversation.html", {
        "conversation": chat, "messages": shown, "conversations": Conversation.owned_by(request.user),
        "models": served, "model": last if last in served else served_models.default(served),
        "sampling": form_values(chat.sampling)})


@login_required
def tokens(request):
    created = None
    refused = None
    if request.method == "POST":
        name = request.POST.get("name", "")[:100]
        refused = nul_refusal("name", name)
        if refused is None:
            _, created = ApiToken.issue(request.user, name)
    return render(request, "chat/tokens.html", {"tokens": request.user.api_tokens.all(), "created": created,
                                                "refused": refused}, status=400 if refused else 200)


@login_required
@require_POST
def revoke_token(request, token_id: int):
    get_object_or_404(ApiToken, pk=token_id, user=request.user).revoke()
    return redirect("tokens")
