"""A conversation as a download: Markdown to read or paste elsewhere, JSON to keep or process.

Both hold the whole conversation as the page shows it (every message shown, of a reply's versions the
one chosen; the system prompt and the sampling settings), not the part that fits the model
(workbench/chat/fitting.py).
"""

from __future__ import annotations

import json
import re

from django.conf import settings

from workbench.chat.models import Conversation, Message

ROLE_HEADINGS = {"system": "System", "user": "User", "assistant": "Assistant"}


def _message(message: Message) -> dict[str, object]:
    record: dict[str, object] = {"role": message.role, "content": message.content,
                                 "created_at": message.created_at.isoformat()}
    if message.role == "assistant":
        record.update(model=message.model or settings.WORKBENCH_MODEL,  # blank: stored when only it was served
                      finish_reason=message.finish_reason, error=message.error or None,
                      usage={"prompt_tokens": message.prompt_tokens, "completion_tokens": message.completion_tokens,
                             "cached_tokens": message.cached_tokens},
                      timings={"time_to_first_token": message.time_to_first_token,
                               "decode_tokens_per_s": message.decode_tokens_per_s})
    return record


def as_json(conversation: Conversation) -> str:
    """The conversation as shown; `model` is the model of its last reply (each reply names its own)."""
    replies = [m for m in conversation.shown_messages() if m.role == "assistant" and m.model]
    return json.dumps({
        "id": conversation.pk, "title": conversation.title,
        "model": replies[-1].model if replies else settings.WORKBENCH_MODEL,
        "created_at": conversation.created_at.isoformat(), "updated_at": conversation.updated_at.isoformat(),
        "system_prompt": conversation.system_prompt, "sampling": conversation.sampling,
        "messages": [_message(m) for m in conversation.shown_messages()],
    }, ensure_ascii=False, indent=2)


def as_markdown(conversation: Conversation) -> str:
    """A `# title`, then one `## Role` section per message with its text as written (it is Markdown
    already, as the page renders it)."""
    parts = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        parts += ["## System", "", conversation.system_prompt, ""]
    for message in conversation.shown_messages():
        parts += [f"## {ROLE_HEADINGS.get(message.role, message.role)}", "", message.content, ""]
        if message.role == "assistant" and message.finish_reason not in ("", "stop"):
            parts += [f"*({message.finish_reason}{': ' + message.error if message.error else ''})*", ""]
    return "\n".join(parts)


def filename(conversation: Conversation, extension: str) -> str:
    """A file name from the title, kept to characters every file system and header takes."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-").lower()[:50] or "conversation"
    return f"{stem}-{conversation.pk}.{extension}"
