"""DEBUG's refusal at a production start: Django's DEBUG shows tracebacks, settings and SQL to whoever
gets an error page, so the web application (workbench/asgi.py) starts with it on only where nobody but
this machine can reach it, that is where every host name it answers (WORKBENCH_ALLOWED_HOSTS) is a
loopback name. docs/OPERATIONS.md ("Secret key and DEBUG") states the decision.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def refuse_debug_beyond_loopback(debug: bool, allowed_hosts: list[str]) -> None:
    reachable = sorted(set(allowed_hosts) - LOOPBACK_HOSTS)
    if debug and reachable:
        raise ImproperlyConfigured(
            f"WORKBENCH_DEBUG is on while the web application answers {', '.join(reachable)} "
            "(WORKBENCH_ALLOWED_HOSTS): DEBUG shows tracebacks and settings to anyone who reaches an error "
            "page. Turn WORKBENCH_DEBUG off for a deployment, or answer only localhost / 127.0.0.1 / [::1] "
            "while debugging.")
