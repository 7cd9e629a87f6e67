from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "workbench.api"
    label = "api"
