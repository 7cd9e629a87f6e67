"""The content-security policy every page is sent with: the browser then runs only the scripts and
styles this server serves as files, so markup that slips into a page (a model's reply, a user's title, a
request id on the dashboard) cannot run script, load another site's resources or post a form elsewhere,
even where an escaping bug let it in.

The pages are built for it: no inline scripts, event-handler attributes or style attributes of our own;
scripts set styles through the DOM (element.style), which a policy does not govern. The chat's rendered
markdown goes through DOMPurify, which keeps `style` attributes: under this policy the browser drops
them (and reports it), which is the point. `'self'` in connect-src covers the page's own ws:// and wss://
(CSP level 3), so the chat socket needs no scheme of its own. `data:` images are the admin's icons.

WORKBENCH_CSP replaces the policy (docs/OPERATIONS.md, "Behind a TLS proxy"); "off" sends none, for a
proxy that sets its own.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

DEFAULT_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))


class ContentSecurityPolicy(MiddlewareMixin):
    """Adds the policy to each response that does not carry one already (sync and async alike, so
    Daphne's requests take no thread hop for it)."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        policy: str = settings.WORKBENCH_CSP
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
