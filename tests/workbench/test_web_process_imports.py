"""The web side's processes load no model code. Every `manage.py` command (a deployment's start runs
migrate; each shared test server's start runs migrate and createapitoken) and the Daphne of the Celery
transport, reading a model's length and tokenizer, import neither torch nor the engine's model: that
import costs seconds of CPU per process. What keeps it so: engine/__init__.py loads its names on first
use, requests are validated through engine/response_format.py, and the web side reads a model's config
and tokenizer through engine/loading/model_files.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL_CODE = ("torch", "engine.engine", "engine.model.llama")

SCRIPT = f"""
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("check")
call_command("migrate", verbosity=0)
call_command("createapitoken", "bob")
import workbench.asgi
from engine.loading.model_files import load_tokenizer
from workbench.serving import model_facts
model_facts.model_length("demo"), load_tokenizer("demo").encode("what a request's checks read")
model_facts.model_card("demo")
web = [name for name in {MODEL_CODE!r} if name in sys.modules]
from engine import Engine  # the control: the engine's own import does load them
print(json.dumps({{"web": web, "engine": [name for name in {MODEL_CODE!r} if name in sys.modules]}}))
"""


def test_management_commands_and_the_celery_web_process_import_no_model_code(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "workbench.settings", "WORKBENCH_DB_PATH": str(tmp_path / "db"),
           "WORKBENCH_TRANSPORT": "celery", "WORKBENCH_SECRET_KEY": "x" * 50}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["engine"] == list(MODEL_CODE), "liveness: importing the Engine is seen"
    assert loaded["web"] == [], f"the web side loaded model code: {loaded['web']}"
