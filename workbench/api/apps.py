from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "workbench.api"
    label = "api"

    def ready(self) -> None:
        # Only a receiver: logging out closes the sockets that session holds in this web process.
        from django.contrib.auth.signals import user_logged_out

        from workbench.protocol import socket_access

        user_logged_out.connect(socket_access.close_session_sockets, dispatch_uid="close-session-sockets")
