"""Throttles on signing in and signing up, counted in Django's cache: Redis with the Celery transport,
so that every web process counts together; this process's memory with the in-process transport, where
it is the only web process.

Failed sign-ins are counted per account (one password guessed at from many addresses) and per client
address (many accounts tried from one); sign-up attempts per client address (the accounts one address
can make, and the invite codes or names it can try). Each count lives in a window of
WORKBENCH_THROTTLE_WINDOW_S opened by its first attempt (workbench/cache_counts.py); at its limit the next
attempt is refused unchecked until the window ends,
a correct password included, which is what stops a guesser. A successful sign-in clears its account's
count, not its address's. The client address is the connection's (REMOTE_ADDR): behind a proxy, start
the server with --proxy-headers so that it is the client's and not the proxy's, and have the proxy
replace X-Forwarded-For with the address it sees, never append to what the client sent: Daphne takes the
header's first address, so a client could otherwise pick the address it is counted under
(docs/OPERATIONS.md).

A cache that cannot be reached (Redis away) throttles nothing and says so in the log: signing in keeps
working while the rest of the deployment waits for Redis.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.http import HttpRequest

from workbench import cache_counts

log = logging.getLogger(__name__)

LOGIN_ACCOUNT, LOGIN_ADDRESS, SIGNUP_ADDRESS = "login-account", "login-address", "signup-address"


def client_address(request: HttpRequest) -> str:
    return request.META.get("REMOTE_ADDR") or "unknown"


def _limit(kind: str) -> int:
    return {LOGIN_ACCOUNT: settings.WORKBENCH_LOGIN_FAILURES_PER_ACCOUNT,
            LOGIN_ADDRESS: settings.WORKBENCH_LOGIN_FAILURES_PER_ADDRESS,
            SIGNUP_ADDRESS: settings.WORKBENCH_SIGNUPS_PER_ADDRESS}[kind]


def _key(kind: str, who: str) -> str:
    # Hashed: a username or address is the client's text, and cache keys have rules of their own.
    return f"throttle:{kind}:{hashlib.sha256(who.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


def _account(username: str) -> str:
    return username.strip().casefold()  # "Alice" and "alice " are guesses at the same account


def refused(*counts: tuple[str, str]) -> int | None:
    """The seconds until the attempt may be made, when any of `counts` ((kind, who) pairs) is at its
    limit; None when none is (a limit of 0 is no limit)."""
    try:
        for kind, who in counts:
            if _limit(kind) and cache_counts.current(_key(kind, who)) >= _limit(kind):
                return cache_counts.seconds_left(_key(kind, who), settings.WORKBENCH_THROTTLE_WINDOW_S)
    except Exception:
        log.warning("the throttle's cache cannot be reached; throttling nothing", exc_info=True)
    return None


def count(*counts: tuple[str, str]) -> None:
    """One more attempt on each of `counts`."""
    try:
        for kind, who in counts:
            cache_counts.add(_key(kind, who), settings.WORKBENCH_THROTTLE_WINDOW_S)
    except Exception:
        log.warning("the throttle's cache cannot be reached; this attempt is not counted", exc_info=True)


def forget(kind: str, who: str) -> None:
    try:
        cache_counts.clear(_key(kind, who))
    except Exception:
        log.warning("the throttle's cache cannot be reached", exc_info=True)


def login_refused(request: HttpRequest, username: str) -> int | None:
    return refused((LOGIN_ADDRESS, client_address(request)), (LOGIN_ACCOUNT, _account(username)))


def login_failed(request: HttpRequest, username: str) -> None:
    count((LOGIN_ADDRESS, client_address(request)), (LOGIN_ACCOUNT, _account(username)))


def login_succeeded(username: str) -> None:
    forget(LOGIN_ACCOUNT, _account(username))


def signup_refused(request: HttpRequest) -> int | None:
    return refused((SIGNUP_ADDRESS, client_address(request)))


def signup_attempted(request: HttpRequest) -> None:
    count((SIGNUP_ADDRESS, client_address(request)))
