"""The capability ratchet and the docs-citation check.

Ratchet: every `ARC_*` name in production code is registered; every Live entry's symbol resolves and
is read by production code outside its own definition; a Dead entry's symbol is gone. Citations:
every `path.py:Symbol` that docs/ cites names a file and a definition that exist.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from engine.host.capabilities import REGISTRY, UnknownFlag, capability, env_value

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = [p for part in ("engine", "workbench") for p in (ROOT / part).rglob("*.py")]
FLAG = re.compile(r"\bARC_[A-Z0-9_]+\b")


def resolve(symbol: str):
    module_name, _, path = symbol.partition(":")
    target = importlib.import_module(module_name)
    for part in path.split("."):
        target = getattr(target, part, None) if not isinstance(target, type) else _class_attribute(target, part)
        if target is None:
            return None
    return target


def _class_attribute(cls: type, name: str):
    # Instance attributes set in __init__ are not on the class: look for the assignment instead.
    if hasattr(cls, name):
        return getattr(cls, name)
    source = Path(importlib.import_module(cls.__module__).__file__).read_text()
    return name if re.search(rf"self\.{name}\s*[:=]", source) else None


def test_every_flag_in_production_code_is_registered():
    used = {name for path in PRODUCTION for name in FLAG.findall(path.read_text())}
    registered = {entry.name for entry in REGISTRY}
    assert used, "liveness: production code reads flags"
    assert used <= registered, f"unregistered flags: {sorted(used - registered)}"


@pytest.mark.parametrize("entry", [e for e in REGISTRY if e.status == "Live"], ids=lambda e: e.name)
def test_live_entries_resolve_and_are_reached(entry):
    assert resolve(entry.symbol) is not None, f"{entry.name}: {entry.symbol} does not resolve"
    attribute = entry.symbol.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    readers = [p for p in PRODUCTION if re.search(rf"\.{attribute}\b", p.read_text())
               and p.name != "capabilities.py"]
    assert readers, f"{entry.name}: no production code reads {attribute}"


def test_dead_entries_left_no_symbol_behind():
    lingering = [e.name for e in REGISTRY if e.status == "Dead" and resolve(e.symbol) is not None]
    assert not lingering, f"Dead entries whose symbol still exists: {lingering}"


def test_unknown_flags_are_refused_and_env_flags_parse(monkeypatch):
    with pytest.raises(UnknownFlag):
        capability("ARC_NO_SUCH_FLAG")
    monkeypatch.setenv("ARC_GRAPH_DEVICE_LOOP", "yes")
    assert env_value("ARC_GRAPH_DEVICE_LOOP") is True
    monkeypatch.setenv("ARC_GRAPH_DEVICE_LOOP", "0")
    assert env_value("ARC_GRAPH_DEVICE_LOOP") is False
    monkeypatch.setenv("ARC_GRAPH_VERIFY_REPLAYS", "8")
    assert env_value("ARC_GRAPH_VERIFY_REPLAYS") == 8
    monkeypatch.setenv("ARC_GRAPH_VERIFY_REPLAYS", "often")
    with pytest.raises(ValueError, match="ARC_GRAPH_VERIFY_REPLAYS must be an integer"):
        env_value("ARC_GRAPH_VERIFY_REPLAYS")


CITATION = re.compile(r"`([\w/]+\.py):([\w.]+)`")


def defined_names(path: Path) -> set[str]:
    """Dotted names defined in a module: functions, classes, methods, module-level assignments."""
    names: set[str] = set()

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + child.name)
                visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.Assign, ast.AnnAssign)) and not prefix:
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))

    visit(ast.parse(path.read_text()))
    return names


def test_every_symbol_cited_in_docs_exists():
    citations = [(doc.name, *m) for doc in (ROOT / "docs").glob("*.md") for m in CITATION.findall(doc.read_text())]
    assert citations, "liveness: the docs cite code"
    missing = [f"{doc}: {path}:{symbol}" for doc, path, symbol in citations
               if not (ROOT / path).is_file() or symbol not in defined_names(ROOT / path)]
    assert not missing, f"docs cite what does not exist: {missing}"
