"""A pytest plugin (loaded by tests/conftest.py) that watches the native CPU kernels' build for the whole
session and says which calls came while pytest was still collecting.

Collecting must never build them: on the GPU machine `pytest --collect-only -m gpu` imports every test
module, and a module that asked `native_available()` at import would compile the C++ kernels there (tens
of seconds of a short device budget) for tests that never run. tests/test_collection_builds_no_kernels.py
reads what this recorded. Watching the suite's own collection, rather than collecting it again in a
subprocess, costs nothing: the suite imports every module anyway.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.kernels.cpu import build


@dataclass
class BuildWatch:
    loaded_before: bool = False  # the build had been asked for before the session began (a conftest's import)
    collecting: bool = True
    during_collection: list[str] = field(default_factory=list)  # the stack of each call, to name the asker
    after_collection: int = 0
    modules: set[Path] = field(default_factory=set)  # every test module collected, before any -m or -k


WATCH = pytest.StashKey[BuildWatch]()


def pytest_sessionstart(session: pytest.Session) -> None:
    watch = BuildWatch(loaded_before="reason" in build._state)
    session.config.stash[WATCH] = watch
    real_load = build._load

    def watched_load() -> str | None:
        if watch.collecting:
            watch.during_collection.append("".join(traceback.format_stack(limit=14)))
        else:
            watch.after_collection += 1
        return real_load()

    build._load = watched_load


def pytest_itemcollected(item: pytest.Item) -> None:
    item.config.stash[WATCH].modules.add(Path(item.path))


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[WATCH].collecting = False
