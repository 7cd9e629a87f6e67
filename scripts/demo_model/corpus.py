"""The demo model's training text: English that every Python 3.11 machine has offline.

Sources: `pydoc_data.topics` (the language reference sections that `help()` shows) and the docstrings
of the standard library's own modules, classes and functions (read with `ast`, so nothing is imported),
and the stdlib's comment paragraphs.
Documents are split into train and held-out sets by a hash of their text, so the split is the same on
every machine and does not depend on file order.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

import pydoc_data.topics

# Folders of the stdlib that are tests, vendored code or non-English data; their text would teach the
# model little English.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "turtledemo", "__pycache__",
                "encodings", "ensurepip", "pydoc_data"}
MIN_DOC_CHARS = 120


def stdlib_docstrings(stdlib: Path) -> list[str]:
    docs = []
    for path in sorted(stdlib.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_DOC_CHARS:
                    docs.append(doc.strip())
    return docs


def stdlib_comment_blocks(stdlib: Path) -> list[str]:
    """Runs of consecutive `#` comment lines, joined into one paragraph each: the stdlib's prose."""
    blocks = []
    for path in sorted(stdlib.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(stdlib).parts):
            continue
        run: list[str] = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
            stripped = line.strip()
            if stripped.startswith("#") and not stripped.startswith("#!"):
                run.append(stripped.lstrip("#").strip())
                continue
            paragraph = " ".join(part for part in run if part)
            if len(paragraph) >= MIN_DOC_CHARS:
                blocks.append(paragraph)
            run = []
    return blocks


def documents() -> list[str]:
    """Every document once, in a fixed order."""
    topics = [pydoc_data.topics.topics[key].strip() for key in sorted(pydoc_data.topics.topics)]
    seen, unique = set(), []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for doc in topics + stdlib_docstrings(stdlib) + stdlib_comment_blocks(stdlib):
        if doc not in seen:
            seen.add(doc)
            unique.append(doc)
    return unique


def is_held_out(doc: str, percent: int = 2) -> bool:
    return int(hashlib.sha256(doc.encode()).hexdigest(), 16) % 100 < percent


def split() -> tuple[list[str], list[str]]:
    docs = documents()
    return [d for d in docs if not is_held_out(d)], [d for d in docs if is_held_out(d)]
