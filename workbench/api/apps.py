from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "workbench.api"
    label = "api"

    def ready(self) -> None:
        # Only receivers: logging out closes the sockets that session holds in this web process, and a
        # finished API request's reproducibility record is kept for its user.
        from django.contrib.auth.signals import user_logged_out

        from workbench.api import reproduce_records
        from workbench.protocol import socket_access
        from workbench.serving import record_keepers

        user_logged_out.connect(socket_access.close_session_sockets, dispatch_uid="close-session-sockets")
        if reproduce_records.keep not in record_keepers.RECORD_KEEPERS:
            record_keepers.RECORD_KEEPERS.append(reproduce_records.keep)
