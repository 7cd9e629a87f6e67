"""`python manage.py createapitoken USERNAME [--name NAME]`: creates the user if absent and prints a
new API token on its last line, where a script reads it (docs/PROTOCOL.md says how a client sends it)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from workbench.api.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for USERNAME (creating the user if absent); the token is the last line."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")

    def handle(self, *args, username, name, **options):
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created user {username} (no password: set one with changepassword)")
        _, plaintext = ApiToken.issue(user, name)
        self.stdout.write(plaintext)
