"""Collecting the tests never builds the native CPU kernels (engine/kernels/cpu/build.py).

On the GPU machine `pytest --collect-only -m gpu` imports every test module, and a module that asked
`native_available()` at import would compile the C++ kernels there from scratch (tens of seconds of a
short device budget) for tests that never run. Modules that need the kernels request the
`native_cpu_kernels` fixture (tests/conftest.py) instead, so the first test that runs builds them.

tests/collection_watch.py watches the build through this session: this reads what it saw while the
suite itself was collected. The GPU machine's collection imports a subset of these modules (its python
lacks the web stack, tests/conftest.py), so a suite that collects here without a build collects there
without one too. `-m` and `-k` select after every module is imported, so any selection of the whole
suite is watched alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.kernels.cpu import build
from tests.collection_watch import WATCH

TESTS = Path(__file__).resolve().parent


def test_collecting_the_suite_asks_for_no_native_build(request):
    collected = {Path(arg.split("::")[0]).resolve() for arg in request.config.args}
    if collected != {TESTS}:
        pytest.skip(f"watches the whole suite's collection; this session collected {request.config.args}")
    watch = request.config.stash[WATCH]
    assert not watch.loaded_before, "the kernels were asked for before collection began (a conftest's import)"
    assert watch.during_collection == [], "asked for while collecting:\n" + "\n".join(watch.during_collection)
    build.ensure_loaded()
    # Liveness: the watch sits on the build's one path, and the one load of this process came after collection.
    assert watch.after_collection == 1
    assert TESTS / "engine" / "test_gpu.py" in watch.modules, "the GPU tests were collected"
