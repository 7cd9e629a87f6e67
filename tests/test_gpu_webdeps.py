"""The web application imports, checks and migrates with only the GPU machine's packages: its image's
and the wheels bench/gpu_webdeps.py fetches for it, no more.

gpu_check.sh's serving benchmark runs `manage.py migrate`, `python -m workbench.serve` and
`manage.py createapitoken` in that python: a web package missing from the wheels stops it at import
(it once lacked dj-database-url, which the settings import). Here a python started with `-S` sees only
a folder of links to those distributions (tests/gpu_image_site.py) and imports every module of
workbench/, the benchmark, Daphne's server, and the engine's optional packages (GGUF, grammars); a
control run without one fetched package must fail on it, so the check cannot pass by seeing the venv.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_webdeps import closure
from tests.gpu_image_site import image_site

ROOT = Path(__file__).resolve().parents[1]
# Runs in the restricted python: every web module, the migrations on a fresh SQLite, the system checks.
SCRIPT = """
import importlib, pkgutil
import django
django.setup()
from django.core.management import call_command
call_command("check", fail_level="ERROR")
call_command("migrate", verbosity=0)
import workbench
modules = [m.name for m in pkgutil.walk_packages(workbench.__path__, "workbench.", onerror=lambda name: 1 / 0)]
for name in modules + ["workbench.asgi", "workbench.urls", "daphne.cli", "daphne.server", "bench.serving",
                       "engine.loading.transcode", "llguidance"]:
    importlib.import_module(name)
from django.urls import get_resolver
get_resolver().url_patterns
print("imported", len(modules), "workbench modules")
"""


def run_in_site(site: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "DJANGO", "WORKBENCH"))}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{site}", DJANGO_SETTINGS_MODULE="workbench.settings",
               WORKBENCH_DB_PATH=str(tmp_path / "db.sqlite3"), WORKBENCH_SECRET_KEY=secrets.token_urlsafe(40))
    return subprocess.run([sys.executable, "-S", "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_the_web_application_imports_with_the_image_and_the_fetched_wheels_only(tmp_path):
    fetched = set(closure())
    assert {"django", "channels", "daphne", "dj-database-url", "redis"} <= fetched, "liveness: the web stack is fetched"
    site = tmp_path / "site"
    site.mkdir()
    left_out = image_site(site, beyond=fetched)
    assert "psycopg" in left_out, "liveness: a package the venv has but the GPU machine would not is absent"
    run = run_in_site(site, tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "workbench modules" in run.stdout

    short = tmp_path / "short"
    short.mkdir()
    image_site(short, beyond=fetched - {"dj-database-url"})
    control = run_in_site(short, tmp_path)
    assert control.returncode != 0 and "No module named 'dj_database_url'" in control.stderr, \
        "liveness: without one fetched package the web application must not import"
