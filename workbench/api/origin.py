"""The websocket origin check: Channels' AllowedHostsOriginValidator, except that a handshake without
an Origin header is let through to authentication.

Browsers always send Origin on a websocket handshake, so cross-site pages riding a user's session are
still refused. Non-browser API clients (the websocket API's users) send none, and must still present
a valid bearer token; refusing them for a missing header would refuse the API itself.
"""

from channels.security.websocket import OriginValidator
from django.conf import settings


class _ApiClientOriginValidator(OriginValidator):
    def valid_origin(self, parsed_origin) -> bool:
        return parsed_origin is None or super().valid_origin(parsed_origin)


def AllowedHostsOriginValidator(application):  # noqa: N802  (mirrors the Channels name it replaces)
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return _ApiClientOriginValidator(application, allowed_hosts)
