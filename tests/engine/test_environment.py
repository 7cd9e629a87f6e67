"""engine/environment.py is the engine's one reader of the environment: no other module of engine/ reads
os.environ (or getenv), and every WORKBENCH_* name the engine's code spells is one it lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import environment

ENGINE = Path(__file__).resolve().parents[2] / "engine"
READS = re.compile(r"os\.environ|getenv")


def engine_sources() -> dict[str, str]:
    return {str(path.relative_to(ENGINE.parent)): path.read_text() for path in ENGINE.rglob("*.py")}


def test_only_the_environment_module_reads_the_environment():
    sources = engine_sources()
    assert READS.search(sources["engine/environment.py"]), "liveness: the pattern finds a read"
    readers = sorted(path for path, text in sources.items() if READS.search(text) and path != "engine/environment.py")
    assert readers == []


def test_every_workbench_variable_the_engine_names_is_listed():
    named = {name for text in engine_sources().values() for name in re.findall(r"\bWORKBENCH_[A-Z_]+\b", text)}
    assert "WORKBENCH_CPU_KERNEL" in named, "liveness: names are found"
    assert named <= set(environment.SWITCHES)


def test_read_refuses_a_name_it_does_not_list_and_reads_flags(monkeypatch):
    with pytest.raises(KeyError, match="WORKBENCH_NOT_A_SWITCH"):
        environment.read("WORKBENCH_NOT_A_SWITCH")
    monkeypatch.setenv("WORKBENCH_FUSED_LAYERS", "off")
    monkeypatch.setenv("ARC_PREFIX_CACHING", "0")
    assert environment.read("WORKBENCH_FUSED_LAYERS") == "off" and environment.read("ARC_PREFIX_CACHING") == "0"
    monkeypatch.delenv("WORKBENCH_MODEL_CACHE", raising=False)
    assert environment.read("WORKBENCH_MODEL_CACHE", "unset") == "unset"
