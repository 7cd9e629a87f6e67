"""The settings the test run uses (pyproject.toml's DJANGO_SETTINGS_MODULE): the workbench's own, with
DEBUG off as in a deployment and a secret key for tests only.

The key goes into the environment before the settings are read, so that the in-process ASGI application
and every Daphne, worker and management command the tests start (they inherit this environment) pass
the production start's check (workbench/secret_key.py) the way a deployment does.
"""

import os

os.environ.setdefault("WORKBENCH_SECRET_KEY", "tests-only-secret-key-not-for-deployment")

from workbench.settings import *  # noqa: E402,F403  (the key must be in the environment first)
