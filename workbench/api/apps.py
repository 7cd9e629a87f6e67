from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "workbench.api"
    label = "api"

    def ready(self) -> None:
        # Only receivers: logging out closes the sockets that session holds in this web process, a change
        # to what an open socket's access check reads ends the answers sockets keep of it, and a
        # finished API request's reproducibility record is kept for its user.
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.contrib.sessions.models import Session
        from django.db.models.signals import post_delete, post_save

        from workbench.api import reproduce_records
        from workbench.api.models import ApiToken
        from workbench.protocol import socket_access
        from workbench.serving import record_keepers

        user_logged_out.connect(socket_access.close_session_sockets, dispatch_uid="close-session-sockets")
        for model in (get_user_model(), ApiToken, Session):
            for signal in (post_save, post_delete):
                signal.connect(socket_access.note_change, sender=model, dispatch_uid=f"socket-access-{model.__name__}")
        if reproduce_records.keep not in record_keepers.RECORD_KEEPERS:
            record_keepers.RECORD_KEEPERS.append(reproduce_records.keep)
