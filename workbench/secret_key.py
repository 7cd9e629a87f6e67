"""Django's secret key: the development default, its refusal at a production start, and the checkout's
own random key that `make run` and `make stack` pass when WORKBENCH_SECRET_KEY is unset.

A production start is the web application loaded with DEBUG off (workbench/asgi.py: Daphne, or
`manage.py runserver`): the key signs its sessions and CSRF tokens, so with the development key, which
anyone can read here, it refuses to start and says how to set a key. Management commands and Celery
workers sign nothing a browser holds and start with any key. docs/OPERATIONS.md states the decision.

    python -m workbench.secret_key    # prints the checkout's key, making it the first time
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DEVELOPMENT_KEY = "workbench-development-key-not-for-deployment"
# Gitignored; one per checkout, so sessions survive restarts of `make run`.
LOCAL_KEY_FILE = Path(__file__).resolve().parent.parent / ".secret-key"


def refuse_development_key(debug: bool, key: str) -> None:
    if not debug and key == DEVELOPMENT_KEY:
        raise ImproperlyConfigured(
            "DEBUG is off and WORKBENCH_SECRET_KEY is unset, so the web application would sign sessions with "
            "the development key, which is public. Set WORKBENCH_SECRET_KEY to a long random string "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))'), or start it with `make run` / "
            "`make stack`, which make one for this checkout, or set WORKBENCH_DEBUG=1 on a development machine.")


def local_key(path: Path = LOCAL_KEY_FILE) -> str:
    """The key in `path`, made (random, readable by its owner only) if there is none yet."""
    if not path.exists():
        draft = path.with_name(f"{path.name}.{os.getpid()}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(draft, path)  # atomic, and refused if a concurrent start made one first: theirs wins
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it to have a new key made")
    return key


if __name__ == "__main__":
    print(local_key())
