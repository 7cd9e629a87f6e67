"""Where a mutant edits: a piece of code found by its syntax tree inside a named function, not by its text.

A mutant names a scope (a function or method as `Class.method`, or "" for the module) and a fragment of
code: an expression, or one or more statements in a row. The fragment must occur exactly once in the
scope, compared as syntax trees, so formatting (line breaks, quotes, parentheses, comments) never
matters, and a refactor that moves or changes the mechanism fails loudly instead of leaving a mutant that
tests nothing. The edit replaces that node's source span with the replacement (an expression in
parentheses, statements indented where the first one stood).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass


class AnchorError(ValueError):
    pass


@dataclass(frozen=True)
class Span:
    start: tuple[int, int]  # (line index from 0, byte column) of the first node
    end: tuple[int, int]    # the same, just past the last node
    indent: int             # byte column of the first node: where replacement statements stand


def _fragment(code: str) -> ast.expr | list[ast.stmt]:
    """An expression where the code is one, else its statements."""
    code = textwrap.dedent(code).strip()
    try:
        return ast.parse(code, mode="eval").body
    except SyntaxError:
        return ast.parse(code).body


def _scope(tree: ast.Module, qualname: str) -> ast.AST:
    node: ast.AST = tree
    for name in filter(None, qualname.split(".")):
        found = [child for child in ast.iter_child_nodes(node)
                 if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name]
        if len(found) != 1:
            raise AnchorError(f"scope {qualname!r}: {len(found)} definitions named {name!r}")
        node = found[0]
    return node


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _matches(scope: ast.AST, fragment: ast.expr | list[ast.stmt]) -> list[tuple[ast.AST, ast.AST]]:
    """(first node, last node) of each occurrence of the fragment in the scope."""
    if isinstance(fragment, ast.expr):
        wanted = _dump(fragment)
        return [(node, node) for node in ast.walk(scope) if isinstance(node, ast.expr) and _dump(node) == wanted]
    wanted_run = [_dump(stmt) for stmt in fragment]
    found: list[tuple[ast.AST, ast.AST]] = []
    for node in ast.walk(scope):
        for _, body in ast.iter_fields(node):
            if not (isinstance(body, list) and body and isinstance(body[0], ast.stmt)):
                continue
            dumps = [_dump(stmt) for stmt in body]
            for i in range(len(body) - len(fragment) + 1):
                if dumps[i: i + len(fragment)] == wanted_run:
                    found.append((body[i], body[i + len(fragment) - 1]))
    return found


def find(source: str, scope: str, original: str) -> Span:
    matches = _matches(_scope(ast.parse(source), scope), _fragment(original))
    if len(matches) != 1:
        raise AnchorError(f"{len(matches)} occurrences of {original.strip()!r} in {scope or 'the module'!r}, "
                          "expected exactly one: the mechanism moved or changed")
    first, last = matches[0]
    assert first.end_lineno is not None and last.end_lineno is not None and last.end_col_offset is not None
    return Span((first.lineno - 1, first.col_offset), (last.end_lineno - 1, last.end_col_offset), first.col_offset)


def replace(source: str, scope: str, original: str, replacement: str) -> str:
    """The source with the one occurrence of `original` in `scope` replaced."""
    span = find(source, scope, original)
    new = textwrap.dedent(replacement).strip()
    if isinstance(_fragment(original), ast.expr):
        new = f"({new})" if new else "None"
    else:
        pad = " " * span.indent
        new = "\n".join((pad + line if i and line else line) for i, line in enumerate((new or "pass").splitlines()))
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    (first_line, first_col), (last_line, last_col) = span.start, span.end
    edited = lines[first_line][:first_col] + new.encode() + lines[last_line][last_col:]
    return b"".join(lines[:first_line] + [edited] + lines[last_line + 1:]).decode()
