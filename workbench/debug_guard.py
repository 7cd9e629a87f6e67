"""DEBUG's refusals: Django's DEBUG shows tracebacks, settings and SQL to whoever gets an error page, so
the web application runs with it on only where nobody but this machine can reach it.

Three checks, each where it can be made:
- at a production start (workbench/asgi.py), every host name the application answers
  (WORKBENCH_ALLOWED_HOSTS) must be a loopback name;
- at the server's start (workbench/serve.py), every address it listens on must be a loopback address,
  and it must not take the client's address from proxy headers: the Host header is the client's to
  write, so a server bound to 0.0.0.0 answering "localhost" served debug pages to anyone who sent
  `Host: localhost`;
- at each request while DEBUG is on (LoopbackClientsOnly, first in MIDDLEWARE then), the client's own
  address must be a loopback address, for a server started some other way (plain `python -m daphne`,
  `runserver 0.0.0.0:8000`), whose bind serve.py never saw.
docs/OPERATIONS.md ("Secret key and DEBUG") states the decision.
"""

from __future__ import annotations

import ipaddress
import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.utils.deprecation import MiddlewareMixin

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def refuse_debug_beyond_loopback(debug: bool, allowed_hosts: list[str]) -> None:
    reachable = sorted(set(allowed_hosts) - LOOPBACK_HOSTS)
    if debug and reachable:
        raise ImproperlyConfigured(
            f"WORKBENCH_DEBUG is on while the web application answers {', '.join(reachable)} "
            "(WORKBENCH_ALLOWED_HOSTS): DEBUG shows tracebacks and settings to anyone who reaches an error "
            "page. Turn WORKBENCH_DEBUG off for a deployment, or answer only localhost / 127.0.0.1 / [::1] "
            "while debugging.")


def is_loopback(address: str) -> bool:
    """An IP address of this machine's loopback interface (127.0.0.0/8, ::1), or the name localhost."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def endpoint_is_loopback(endpoint: str) -> bool:
    """Whether a Twisted server endpoint (what Daphne listens on: "tcp:port=8000:interface=127.0.0.1",
    "tcp6:port=8000:interface=\\:\\:1", "unix:...", "fd:...") takes connections from this machine only.
    A TCP endpoint without an interface listens on every one; unix sockets and inherited descriptors
    may sit behind anything, so only TCP on a loopback interface counts."""
    kind, _, rest = endpoint.partition(":")
    if kind not in ("tcp", "tcp6"):
        return False
    fields = dict(field.partition("=")[::2] for field in re.split(r"(?<!\\):", rest))
    return is_loopback(fields.get("interface", "").replace("\\:", ":"))


def refuse_debug_on_reachable_endpoints(debug: bool, endpoints: list[str], proxy_headers: bool) -> None:
    """With DEBUG on, the server's start is refused unless it listens on loopback only and takes each
    client's address from the connection (not from a proxy's headers, which a client can write)."""
    if not debug:
        return
    reachable = [endpoint for endpoint in endpoints if not endpoint_is_loopback(endpoint)]
    if reachable or proxy_headers:
        why = f"listens on {', '.join(reachable)}" if reachable else "takes client addresses from proxy headers"
        raise ImproperlyConfigured(
            f"WORKBENCH_DEBUG is on while the server {why}: DEBUG shows tracebacks and settings to anyone who "
            "reaches an error page, whatever Host header they send. Bind to 127.0.0.1 (-b 127.0.0.1) while "
            "debugging, or turn WORKBENCH_DEBUG off.")


class LoopbackClientsOnly(MiddlewareMixin):
    """While DEBUG is on, a request from an address beyond this machine is refused (403) before any view
    can fail on it with a debug page. The address is the connection's (REMOTE_ADDR), not the Host header."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if settings.DEBUG and not is_loopback(request.META.get("REMOTE_ADDR") or ""):
            return HttpResponseForbidden("This server runs with WORKBENCH_DEBUG on and answers this machine only.",
                                         content_type="text/plain")
        return None
