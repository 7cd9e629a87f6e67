from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "workbench.ops"
    label = "ops"

    def ready(self) -> None:
        # Only a listener: it runs when a transport starts, never for a management command that serves nothing.
        from workbench.ops import recorder
        from workbench.serving import bridge

        if recorder.start not in bridge.started_listeners:
            bridge.started_listeners.append(recorder.start)
