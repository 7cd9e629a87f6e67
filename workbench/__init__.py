"""The Django project: settings, ASGI routing, and the apps (serving, api)."""
