from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "workbench.ops"
    label = "ops"
