"""The engine tests' model: `checkpoint`, a tiny random llama built once per session and copied for
each test, so that a test may edit its own (a generation_config, a broken config.json) without another
test seeing the edit. A module that needs other weights says so with a marker, e.g.
`pytestmark = pytest.mark.checkpoint(seed=4)`; `built_checkpoints` is the session's cache behind it,
for module-scoped fixtures that only read a checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import build_tiny_checkpoint

DEFAULT = {"model_type": "llama", "seed": 11}


def pytest_configure(config):
    config.addinivalue_line("markers", "checkpoint(model_type, seed, **overrides): the `checkpoint` fixture's "
                                       "model (tests/engine/conftest.py; llama seed 11 without it)")


@pytest.fixture(scope="session")
def built_checkpoints(tmp_path_factory):
    """Factory: built_checkpoints("llama", seed=11, **overrides) -> a directory built once per session for
    those arguments. Shared: read it, never write into it."""
    built: dict[str, Path] = {}

    def build(model_type: str = "llama", seed: int = 0, **overrides) -> Path:
        key = repr((model_type, seed, sorted(overrides.items())))  # overrides may hold dicts
        if key not in built:
            built[key] = build_tiny_checkpoint(tmp_path_factory.mktemp(model_type), model_type, seed, **overrides)
        return built[key]

    return build


@pytest.fixture
def checkpoint(request, built_checkpoints, tmp_path) -> Path:
    """This test's own copy of the module's checkpoint (the `checkpoint` marker's, llama seed 11 without one)."""
    marker = request.node.get_closest_marker("checkpoint")
    args = {**DEFAULT, **(marker.kwargs if marker else {})}
    return Path(shutil.copytree(built_checkpoints(**args), tmp_path / "checkpoint"))
