"""`python -m workbench.serve [daphne options]`: Daphne serving the workbench, with its websocket limits.

The one place that builds the web process's command line: `make run`, scripts/stack.py, the Dockerfile,
docker-compose.yml and the tests' Daphne all start it. Every Daphne option passes through; the
application defaults to workbench.asgi:application.

Why not plain `python -m daphne`: Daphne's autobahn factory refuses a websocket message over 1 MiB by
dropping the TCP connection (autobahn's failByDrop), so a client sees a reset with no close frame and
every request multiplexed on that socket is lost with no word. Here two limits hold instead:
- up to WORKBENCH_SOCKET_MESSAGE_BYTES a message reaches the application, which refuses one over
  WORKBENCH_MAX_FRAME_BYTES whole with a `frame_too_large` error frame; the socket and its other
  requests live on (workbench/protocol/json_socket.py);
- over it, the server closes the socket with code 1009 (message too big) and a reason naming the limit,
  as soon as the frame's header says its length, without buffering the rest.
The outer limit bounds what one socket can make the server hold in memory.

Its HTTP requests have a door too (workbench/api/http_door.py, door_request.py): a body over
WORKBENCH_MAX_FRAME_BYTES, or a large one for a route that reads it on the input thread without a valid
token or while its user's share of that thread is spent, is answered from its headers (as the route
answers such a refusal) and never read into memory, a file or the application.

Its sockets are built with a door (workbench/protocol/door_protocol.py, frame_door.py): a message over
the socket's frame rate, over WORKBENCH_MAX_FRAME_BYTES, or large while its user's share of the input
thread is spent is dropped as it arrives, before its UTF-8 is validated or it is decoded and parsed, and
the consumer answers it with the refusal's `error` frame. The door reaches the consumer in the scope's
`extensions`.

With DEBUG on it also refuses to listen anywhere but on loopback (workbench/debug_guard.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

APPLICATION = "workbench.asgi:application"


def command_line(argv: list[str], message_bytes: int) -> list[str]:
    """Daphne's arguments: the message and frame limits (unless given), `argv`, and the application
    unless `argv` names one (its one positional argument comes last)."""
    limits = [f"--{option}={message_bytes}" for option in ("websocket-max-message-size", "websocket-max-frame-size")
              if not any(arg.startswith(f"--{option}") for arg in argv)]
    names_application = bool(argv) and ":" in argv[-1] and not argv[-1].startswith("-")
    return [*limits, *argv, *([] if names_application else [APPLICATION])]


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")
    from daphne.cli import CommandLineInterface
    from daphne.server import Server
    from django.conf import settings

    from workbench.debug_guard import refuse_debug_on_reachable_endpoints
    from workbench.protocol import frame_door
    from workbench.protocol.door_protocol import DoorWebSocketProtocol
    from workbench.serving import heap

    class ClosingServer(Server):
        """Daphne whose websockets close with 1009 over the size limit instead of dropping the TCP
        connection, and whose websockets and HTTP requests have a door. The factories are built inside
        run(); failByDrop and the protocols are set once the reactor runs, before it accepts any
        connection (each protocol copies the factory's options as it connects)."""

        def __init__(self, application: object, endpoints: list[str] | None = None, **options: Any) -> None:
            refuse_debug_on_reachable_endpoints(settings.DEBUG, endpoints or [],
                                                options.get("proxy_forwarded_address_header") is not None)
            heap.serving_process()  # the application is loaded: Django and everything it imports
            super().__init__(application, endpoints=endpoints, **options)

        def run(self) -> None:
            from twisted.internet import reactor

            reactor.callWhenRunning(self._give_doors)
            super().run()

        def _give_doors(self) -> None:
            from workbench.api import door_request  # imports models: once the application has set Django up

            self.ws_factory.setProtocolOptions(failByDrop=False)
            self.ws_factory.protocol = DoorWebSocketProtocol
            door_request.install(self.http_factory)

        def create_application(self, protocol: object, scope: dict[str, Any]) -> object:
            door = getattr(protocol, "door", None)
            if door is not None:
                scope = {**scope, "extensions": {**scope.get("extensions", {}), frame_door.SCOPE_KEY: door}}
            return super().create_application(protocol, scope)

    class Command(CommandLineInterface):
        server_class = ClosingServer

    Command().run(command_line(argv, settings.WORKBENCH_SOCKET_MESSAGE_BYTES))


if __name__ == "__main__":
    main(sys.argv[1:])
