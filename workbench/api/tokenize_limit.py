"""The per-user limit on /tokenize and /detokenize (WORKBENCH_USER_TOKENIZE_PER_MINUTE): calls a user may
make in a minute, counted in Django's cache (Redis with the Celery transport, so every web process counts
together; this process's memory otherwise). They run on the web process's event loop and are not
generations, so the request limits (workbench/serving/limits.py) do not count them; over this one the
call is refused as the request limits refuse one, 429 `rate_limited` with Retry-After. A cache that
cannot be reached counts nothing (logged)."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)


def refusal(user_key: object) -> int | None:
    """Counts one call of the user's; the seconds until the next minute when it is over the limit, else None."""
    limit = settings.WORKBENCH_USER_TOKENIZE_PER_MINUTE
    if not limit:
        return None
    now = time.time()
    minute = int(now // 60)
    key = f"tokenize:{user_key}:{minute}"
    try:
        if not cache.add(key, 1, timeout=61):
            if cache.incr(key) > limit:
                return max(1, int((minute + 1) * 60 - now + 0.999))
    except Exception:
        log.warning("the tokenize limit's cache cannot be reached; counting nothing", exc_info=True)
    return None
