"""The per-user limit on /tokenize and /detokenize (WORKBENCH_USER_TOKENIZE_PER_MINUTE): calls a user may
make in a minute, counted in Django's cache (Redis with the Celery transport, so every web process counts
together; this process's memory otherwise). They run on the web process's event loop and are not
generations, so the request limits (workbench/serving/limits.py) do not count them; over this one the
call is refused as the request limits refuse one, 429 `rate_limited` with Retry-After. The minute opens
at the user's first call (workbench/cache_counts.py). A cache that cannot be reached counts nothing
(logged)."""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.conf import settings

from workbench import cache_counts
from workbench.api.http_api import ApiError

log = logging.getLogger(__name__)


def refusal(user_key: object) -> int | None:
    """Counts one call of the user's; over the limit, the seconds until the user's minute ends, else None."""
    limit = settings.WORKBENCH_USER_TOKENIZE_PER_MINUTE
    if not limit:
        return None
    key = f"tokenize:{user_key}"
    try:
        if cache_counts.add(key, 60) > limit:
            return cache_counts.seconds_left(key, 60)
    except Exception:
        log.warning("the tokenize limit's cache cannot be reached; counting nothing", exc_info=True)
    return None


async def check(user_key: object) -> None:
    """Counts one call (/tokenize, /detokenize, /v1/messages/count_tokens); over the limit, ApiError 429."""
    retry_after = await sync_to_async(refusal)(user_key)
    if retry_after is not None:
        raise ApiError(429, f"at most {settings.WORKBENCH_USER_TOKENIZE_PER_MINUTE} /tokenize, /detokenize and "
                            "count_tokens calls a minute per user", code="rate_limited", kind="rate_limit_error",
                       retry_after=retry_after)
