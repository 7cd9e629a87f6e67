"""`python manage.py ensureadmin`: the embedded default's admin user (`make run` calls it).

Creates superuser "admin" (password from WORKBENCH_ADMIN_PASSWORD, default "admin") if no such user
exists; an existing admin is left as it is, so a changed password survives restarts.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from workbench.env import env_str


class Command(BaseCommand):
    help = "Create the admin user if absent."

    def handle(self, *args, **options):
        users = get_user_model()
        if users.objects.filter(username="admin").exists():
            self.stdout.write("admin user exists")
            return
        users.objects.create_superuser("admin", password=env_str("WORKBENCH_ADMIN_PASSWORD", "admin"))
        self.stdout.write("created admin user (password from WORKBENCH_ADMIN_PASSWORD, default 'admin')")
