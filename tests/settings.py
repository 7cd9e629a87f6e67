"""The settings the test run uses (pyproject.toml's DJANGO_SETTINGS_MODULE), and the servers, workers
and commands it starts (tests/cluster.py): the workbench's own, with DEBUG off as in a deployment, a
secret key for tests only, and a fast password hasher.

The key (and the sign-up settings below) go into the environment before the settings are read, so
that the in-process ASGI application and every Daphne, worker and management command the tests start
(they inherit this environment) pass the production start's check (workbench/secret_key.py) the way a
deployment does.
"""

import os

os.environ.setdefault("WORKBENCH_SECRET_KEY", "tests-only-secret-key-not-for-deployment")
# The shared servers' tests sign up users of their own (tests/users.py), many from 127.0.0.1: sign-up is
# open and its per-address throttle off there. The sign-up policy's and the throttle's own tests set them.
os.environ.setdefault("WORKBENCH_SIGNUP", "open")
os.environ.setdefault("WORKBENCH_SIGNUPS_PER_ADDRESS", "0")
# The protocol fuzzers and load tests send frames as fast as a socket takes them: no frame limit on the
# shared servers. Its own test runs on the limited Daphne (tests/workbench/conftest.py), at a low limit.
os.environ.setdefault("WORKBENCH_SOCKET_FRAMES_PER_S", "0")
# No replay audit drawn at random: a test's run must not change with a draw. The audit's own tests set
# the share (tests/engine/test_replay_audit.py, tests/workbench/test_reproduce.py).
os.environ.setdefault("ARC_REPLAY_AUDIT_PERMILLE", "0")

from django.conf import global_settings  # noqa: E402

from workbench.settings import *  # noqa: E402,F403  (the key must be in the environment first)

# New passwords hashed with MD5, as Django's testing docs advise: the default PBKDF2's million rounds take
# 0.23 s a hash here, and the suite signs up, signs in and fails sign-ins by the hundred, in the shared
# servers too (they run these settings: tests/cluster.py). Django's own hashers stay after it, so a hash
# made under the deployment's settings still checks. Those settings keep Django's default
# (tests/workbench/test_env.py).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]
