from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "workbench.chat"
    label = "chat"
