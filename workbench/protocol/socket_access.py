"""Who may still use an open websocket: read again at every frame a client sends, and pushed to the
session's sockets when it signs out.

A socket's user is authenticated once, at the handshake. `refusal` asks the database again, so that a
revoked API token, a deactivated user, a session signed out elsewhere, a password changed since the
session signed in, or an operator who is no longer staff loses the socket at its next frame
(workbench/protocol/json_socket.py calls it before anything else of a frame). Its cost is one indexed
query per frame: for a session socket the user's row by primary key with an EXISTS on the session's row
by its primary key, the session key, in one round trip; for an API-token socket the token's row by its
unique digest, joined to its user's row. (Sessions kept outside the database, a cache or signed cookies,
cost their store's own lookup beside it.)

A consumer keeps an answer "it may" for WORKBENCH_SOCKET_RECHECK_S (workbench/protocol/json_socket.py):
those queries run on the one thread that every socket's database calls share, and a socket sending its
fifty frames a second would keep it busy for everyone. A change made in this process (a user, an API
token or a session saved or deleted: a revoke, a password change, a deactivation, a logout through any
page or the admin) counts in `changes()` and ends every kept answer at once; a change made by another
process, or straight in the database, is seen within WORKBENCH_SOCKET_RECHECK_S.

Logging out (Django's `user_logged_out`) sends `session.signed_out` to the group named by the session's
key, which every socket opened with that session joins: such a socket is told `signed_out` and closed
with SIGNED_OUT at once. The consumers' channel layer is in memory, one per web process, also with the
Celery transport (workbench/settings.py): the message reaches the sockets of the process that served
the logout. A socket held by another web process learns it at its next frame, from `refusal`; one that
only listens (a reply streaming to it) keeps listening until then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import HASH_SESSION_KEY, get_user_model
from django.db.models import Exists, Value
from django.utils import timezone
from django.utils.crypto import constant_time_compare

# The close code of a socket whose session signed out: the chat page says so instead of reconnecting.
SIGNED_OUT_CLOSE = 4440
SIGNED_OUT_EVENT = "session.signed_out"  # handled by JsonSocketConsumer.session_signed_out


@dataclass(frozen=True)
class Refusal:
    """Why an open socket may go on no more: its `error` frame's code and message, and the close code."""

    code: str
    message: str
    close_code: int


TOKEN_REVOKED = Refusal("token_revoked", "this socket's API token was revoked (or its user deactivated); "
                                         "the socket closes with code 4401", 4401)
ACCOUNT_DISABLED = Refusal("account_disabled", "your account was deactivated; the socket closes with code 4401", 4401)
SIGNED_OUT = Refusal("signed_out", "you signed out (in this or another tab); sign in again", SIGNED_OUT_CLOSE)
PASSWORD_CHANGED = Refusal("password_changed", "your password was changed since this page signed in; sign in again",
                           SIGNED_OUT_CLOSE)
NOT_STAFF = Refusal("forbidden", "operators only (staff): you are no longer staff; the socket closes with code 4403",
                    4403)


def session_group(scope: Mapping[str, Any]) -> str | None:
    """The group of the sockets opened with this scope's session, or None: a socket opened with an API
    token outlives the session of whoever made the token, and one without a session key has none."""
    if scope.get("bearer_token"):
        return None
    key = getattr(scope.get("session"), "session_key", None)
    return _group(key) if key else None


def _group(session_key: str) -> str:
    return f"session-{session_key}"  # Django's session keys are lowercase letters and digits, as group names allow


# An API token's active user, or None (the api app's ApiToken.user_for, handed in by the consumer that
# takes tokens: this module sits below the apps and imports none of them).
TokenHolder = Callable[[str], Any]


@database_sync_to_async
def refusal(scope: Mapping[str, Any], token_holder: TokenHolder, staff: bool = False) -> Refusal | None:
    """Why the socket of `scope` may not take another frame (None: it may). `token_holder`: how the
    socket's API tokens are looked up. `staff`: the socket is for operators only."""
    user = scope.get("user")
    token = scope.get("bearer_token")
    if isinstance(token, str):
        holder = token_holder(token)
        if holder is None or user is None or holder.pk != user.pk:
            return TOKEN_REVOKED
        return NOT_STAFF if staff and not holder.is_staff else None
    session: Any = scope.get("session")
    key = getattr(session, "session_key", None)
    stored = getattr(session, "get_model_class", None) if key else None  # the db and cached_db stores
    signed_in = Value(True) if stored is None else \
        Exists(stored().objects.filter(session_key=key, expire_date__gt=timezone.now()))
    row = get_user_model().objects.filter(pk=getattr(user, "pk", -1)).annotate(signed_in=signed_in) \
        .values_list("is_active", "is_staff", "signed_in", "password").first()  # pk -1: no one
    if row is None or not row[0]:
        return ACCOUNT_DISABLED
    if not row[2] or (key and stored is None and not session.exists(key)):
        return SIGNED_OUT
    if not _password_unchanged(session, row[3]):
        return PASSWORD_CHANGED
    return NOT_STAFF if staff and not row[1] else None


def _password_unchanged(session: Any, password: str) -> bool:
    """Whether the session signed in with the password the user has now: Django's own test (its
    get_user, which signs a page's session out at its next request after a password change), the
    session's HASH_SESSION_KEY against the hash of the current password, the secret key's fallbacks
    included. A session without one (no sign-in through django.contrib.auth) has nothing to compare."""
    signed_with = session.get(HASH_SESSION_KEY) if session is not None else None
    if signed_with is None:
        return True
    now = get_user_model()(password=password)
    return constant_time_compare(signed_with, now.get_session_auth_hash()) or any(
        constant_time_compare(signed_with, fallback) for fallback in now.get_session_auth_fallback_hash())


_changes_lock = threading.Lock()
_changes = 0


def changes() -> int:
    """How many changes `refusal` could read differently this process has saved: a kept answer
    holds only while this stays what it was when the answer was read."""
    return _changes


def note_change(sender: object, **kwargs: object) -> None:
    """post_save and post_delete receiver for the user model, API tokens and sessions."""
    global _changes
    with _changes_lock:
        _changes += 1


def close_session_sockets(sender: object, request: object, user: object, **kwargs: object) -> None:
    """`user_logged_out` receiver: the session's sockets in this web process are closed, SIGNED_OUT."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    layer = get_channel_layer()
    if key and layer is not None:
        async_to_sync(layer.group_send)(_group(key), {"type": SIGNED_OUT_EVENT})
